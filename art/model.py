"""ART's `art.model` import path."""

from typing import Any

from ._refusals import refused_name
from .core.metrics.history_keys import (
    METRIC_SECTIONS,
    METRIC_SPLITS,
    WANDB_CANONICAL_METRIC_KEYS,
    WANDB_CANONICAL_METRIC_PREFIXES,
)
from .core.model import Model, TrainableModel
from .core.store.model_store import METRICS_BUILDER_STATE_KEY


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = [
    "METRICS_BUILDER_STATE_KEY",
    "METRIC_SECTIONS",
    "METRIC_SPLITS",
    "WANDB_CANONICAL_METRIC_KEYS",
    "WANDB_CANONICAL_METRIC_PREFIXES",
    "Model",
    "TrainableModel",
]
