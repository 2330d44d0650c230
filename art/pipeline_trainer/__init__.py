"""ART's import path of the pipeline trainer; the implementation is `art.pipeline`."""

from typing import Any

from .._refusals import refused_name
from ..pipeline import (
    ConfigT,
    EvalFn,
    PipelineTrainer,
    RolloutFn,
    ScenarioT,
    SingleRolloutFn,
    StatusReporter,
    make_group_rollout_fn,
)
from ..pipeline.retention import (
    CHECKPOINT_CREATED_AT_METRIC,
    CHECKPOINT_EVAL_COMPLETED_METRIC,
    CHECKPOINT_SAVED_METRIC,
    CheckpointInfo,
    CheckpointRetentionContext,
    CheckpointRetentionStrategy,
    keep_recent_and_top,
)
from ..pipeline_tuner.config import PipelineAutotuneConfig, PipelineRuntimeConfig


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = [
    "CHECKPOINT_CREATED_AT_METRIC",
    "CHECKPOINT_EVAL_COMPLETED_METRIC",
    "CHECKPOINT_SAVED_METRIC",
    "CheckpointInfo",
    "CheckpointRetentionContext",
    "CheckpointRetentionStrategy",
    "ConfigT",
    "EvalFn",
    "PipelineAutotuneConfig",
    "PipelineRuntimeConfig",
    "PipelineTrainer",
    "RolloutFn",
    "ScenarioT",
    "SingleRolloutFn",
    "StatusReporter",
    "keep_recent_and_top",
    "make_group_rollout_fn",
]
