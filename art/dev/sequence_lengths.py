"""ART's `art.dev.sequence_lengths` import path."""

from ..runtime.models import max_seq_length_from_model_config

__all__ = ["max_seq_length_from_model_config"]
