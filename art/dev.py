"""ART's `art.dev` import path: advanced model and training configuration."""

from .core.dev import (
    EngineArgs,
    InitArgs,
    InternalModelConfig,
    PeftArgs,
    TrainConfig,
    TrainerArgs,
)

__all__ = [
    "EngineArgs",
    "InitArgs",
    "InternalModelConfig",
    "PeftArgs",
    "TrainConfig",
    "TrainerArgs",
]
