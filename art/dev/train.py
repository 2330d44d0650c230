"""ART's `art.dev.train` import path."""

from ..core.data.dev import TrainConfig, TrainSFTConfig

__all__ = ["TrainConfig", "TrainSFTConfig"]
