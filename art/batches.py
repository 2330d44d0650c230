"""ART's `art.batches` import path (its batching helper is refused: see the name's reason)."""

from .core.data.not_built import trajectory_group_batches

__all__ = ["trajectory_group_batches"]
