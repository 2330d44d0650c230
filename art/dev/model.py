"""ART's `art.dev.model` import path: the model configuration types.

The trainer's option enums (`OptimizerNames`, `SchedulerType`, ...) are transformers' own,
as in ART; they are loaded from transformers on first use, so this module stays light.
"""

from typing import Any

from .._refusals import refused_name
from ..core.data.dev import (
    InitArgs,
    InternalModelConfig,
    LoRAConfig,
    PeftArgs,
    RolloutWeightUpdateMode,
    TrainerArgs,
    VllmRuntimeArgs,
    VllmRuntimeMode,
)
from . import TinkerArgs, TinkerNativeArgs, TinkerTrainingClientArgs

RolloutWeightsMode = RolloutWeightUpdateMode
"""ART 0.5.18's name of the type of `InternalModelConfig.rollout_weights_mode`."""

_TRANSFORMERS = {
    "DebugOption": "transformers.debug_utils",
    "FSDPOption": "transformers.trainer_utils",
    "HubStrategy": "transformers.trainer_utils",
    "IntervalStrategy": "transformers.trainer_utils",
    "OptimizerNames": "transformers.training_args",
    "SaveStrategy": "transformers.trainer_utils",
    "SchedulerType": "transformers.trainer_utils",
}


def __getattr__(name: str) -> Any:
    if name in _TRANSFORMERS:
        import importlib

        return getattr(importlib.import_module(_TRANSFORMERS[name]), name)
    return refused_name(__name__, name)


__all__ = [
    "InitArgs",
    "InternalModelConfig",
    "LoRAConfig",
    "PeftArgs",
    "RolloutWeightUpdateMode",
    "RolloutWeightsMode",
    "TinkerArgs",
    "TinkerNativeArgs",
    "TinkerTrainingClientArgs",
    "TrainerArgs",
    "VllmRuntimeArgs",
    "VllmRuntimeMode",
    *_TRANSFORMERS,
]
