"""ART's import path of the pipeline trainer; the implementation is `art.pipeline`."""

from ..pipeline import (
    ConfigT,
    EvalFn,
    PipelineTrainer,
    RolloutFn,
    ScenarioT,
    SingleRolloutFn,
    make_group_rollout_fn,
)

__all__ = [
    "ConfigT",
    "EvalFn",
    "PipelineTrainer",
    "RolloutFn",
    "ScenarioT",
    "SingleRolloutFn",
    "make_group_rollout_fn",
]
