"""ART's import path of the pipeline trainer; the implementation is `art.pipeline`."""

from ..core.not_built import not_built_class
from ..pipeline import (
    ConfigT,
    EvalFn,
    PipelineTrainer,
    RolloutFn,
    ScenarioT,
    SingleRolloutFn,
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

StatusReporter = not_built_class(
    "art.pipeline_trainer.StatusReporter",
    "PipelineTrainer reports its own progress (a bar, and per-step history rows: "
    "staleness, queue depth, dropped groups); a reporter of your own is not supported",
)

__all__ = [
    "CHECKPOINT_CREATED_AT_METRIC",
    "CHECKPOINT_EVAL_COMPLETED_METRIC",
    "CHECKPOINT_SAVED_METRIC",
    "CheckpointInfo",
    "CheckpointRetentionContext",
    "CheckpointRetentionStrategy",
    "ConfigT",
    "EvalFn",
    "PipelineTrainer",
    "RolloutFn",
    "ScenarioT",
    "SingleRolloutFn",
    "StatusReporter",
    "keep_recent_and_top",
    "make_group_rollout_fn",
]
