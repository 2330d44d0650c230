"""ART's `art.dev` import path: advanced model and training configuration.

ART's vLLM-server settings `OpenAIServerConfig` and `ServerArgs` are its TypedDicts (what a
client sends `art run`); `get_openai_server_config` and `get_model_config` have no
counterpart here: using one raises `NotBuiltError` saying what to use instead. ART's
submodules (`art.dev.model`, `.engine`, `.train`, `.openai_server`, `.validate`,
`.get_model_config`, `.sequence_lengths`) hold the same objects.
"""

from typing import Any

from .._refusals import refused_name
from ..core.data.dev import (
    EngineArgs,
    InitArgs,
    InternalModelConfig,
    LoRAConfig,
    OpenAIServerConfig,
    PeftArgs,
    RolloutWeightUpdateMode,
    ServerArgs,
    TrainConfig,
    TrainerArgs,
    TrainSFTConfig,
    VllmRuntimeArgs,
    is_dedicated_mode,
    is_external_vllm_mode,
    validate_dedicated_config,
)
from ..core.data.not_built import not_built_class, not_built_function

# Imported from its submodule (as ART does), so `art.dev.get_model_config` stays the
# function once the module of that name has been imported.
from .get_model_config import get_model_config

_SERVER = (
    "this version serves with its own engine, not ART's vLLM OpenAI server; its settings "
    "are InternalModelConfig(engine_args=EngineArgs(max_num_seqs=..., max_model_len=...))"
)
get_openai_server_config = not_built_function("art.dev.get_openai_server_config", _SERVER)
_TINKER = "ART's Tinker backends (TinkerBackend, TinkerNativeBackend) are not built here"
TinkerArgs = not_built_class("art.dev.TinkerArgs", _TINKER)
TinkerNativeArgs = not_built_class("art.dev.TinkerNativeArgs", _TINKER)
TinkerTrainingClientArgs = not_built_class("art.dev.TinkerTrainingClientArgs", _TINKER)


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = [
    "EngineArgs",
    "InitArgs",
    "InternalModelConfig",
    "LoRAConfig",
    "OpenAIServerConfig",
    "PeftArgs",
    "RolloutWeightUpdateMode",
    "ServerArgs",
    "TinkerArgs",
    "TinkerNativeArgs",
    "TinkerTrainingClientArgs",
    "TrainConfig",
    "TrainSFTConfig",
    "TrainerArgs",
    "VllmRuntimeArgs",
    "get_model_config",
    "get_openai_server_config",
    "is_dedicated_mode",
    "is_external_vllm_mode",
    "validate_dedicated_config",
]
