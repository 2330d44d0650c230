"""PipelineTrainer: rollouts and training overlapped, staleness bounded.

Imported as ART spells it: `art.PipelineTrainer`, or `from art.pipeline_trainer import
PipelineTrainer, make_group_rollout_fn, StatusReporter`.
"""

from ._types import ConfigT, EvalFn, RolloutFn, ScenarioT, SingleRolloutFn
from .status import StatusReporter
from .trainer import PipelineTrainer, make_group_rollout_fn

__all__ = [
    "ConfigT",
    "EvalFn",
    "PipelineTrainer",
    "RolloutFn",
    "ScenarioT",
    "SingleRolloutFn",
    "StatusReporter",
    "make_group_rollout_fn",
]
