"""ART's `art.dev` import path: advanced model and training configuration.

ART's vLLM-server settings `OpenAIServerConfig` and `ServerArgs` are its TypedDicts (what a
client sends `art run`); `get_openai_server_config` and `get_model_config` have no
counterpart here: using one raises `NotBuiltError` saying what to use instead.
"""

from .core.dev import (
    EngineArgs,
    InitArgs,
    InternalModelConfig,
    OpenAIServerConfig,
    PeftArgs,
    ServerArgs,
    TrainConfig,
    TrainerArgs,
    TrainSFTConfig,
    is_dedicated_mode,
    validate_dedicated_config,
)
from .core.not_built import not_built_class, not_built_function

_SERVER = (
    "this version serves with its own engine, not ART's vLLM OpenAI server; its settings "
    "are InternalModelConfig(engine_args=EngineArgs(max_num_seqs=..., max_model_len=...))"
)
get_openai_server_config = not_built_function("art.dev.get_openai_server_config", _SERVER)
_TINKER = "ART's Tinker backends (TinkerBackend, TinkerNativeBackend) are not built here"
TinkerArgs = not_built_class("art.dev.TinkerArgs", _TINKER)
TinkerNativeArgs = not_built_class("art.dev.TinkerNativeArgs", _TINKER)
TinkerTrainingClientArgs = not_built_class("art.dev.TinkerTrainingClientArgs", _TINKER)
get_model_config = not_built_function(
    "art.dev.get_model_config",
    "defaults are the fields of InternalModelConfig(); read model.internal_config",
)

__all__ = [
    "EngineArgs",
    "InitArgs",
    "InternalModelConfig",
    "OpenAIServerConfig",
    "PeftArgs",
    "ServerArgs",
    "TinkerArgs",
    "TinkerNativeArgs",
    "TinkerTrainingClientArgs",
    "TrainConfig",
    "TrainSFTConfig",
    "TrainerArgs",
    "get_model_config",
    "get_openai_server_config",
    "is_dedicated_mode",
    "validate_dedicated_config",
]
