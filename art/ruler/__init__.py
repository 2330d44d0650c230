"""RULER: relative scores for the trajectories of a group from an LLM judge."""

from ..core.not_built import not_built_function

_MISSING = "RULER (LLM-judge relative scoring through LiteLLM) is not built yet"

ruler = not_built_function("ruler", _MISSING)
ruler_score_group = not_built_function("ruler_score_group", _MISSING)

__all__ = ["ruler", "ruler_score_group"]
