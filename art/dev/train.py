"""ART's `art.dev.train` import path."""

from ..core.dev import TrainConfig, TrainSFTConfig

__all__ = ["TrainConfig", "TrainSFTConfig"]
