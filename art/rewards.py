"""ART's `art.rewards` import path."""

from .ruler import ruler, ruler_score_group

__all__ = ["ruler", "ruler_score_group"]
