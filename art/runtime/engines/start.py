"""Picking and starting an engine: the one place that names an engine kind.

The model service and the Ray replica both start their engines here, each on the
machine that will run it, so the choice follows that machine's CUDA and vLLM
environment, and every `EngineArgs` field is honoured the same way by both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.data import dev
from .base import Engine, EngineName, EngineSpec

if TYPE_CHECKING:
    from ..torch_thread import TorchThread


def choose_engine(config: dev.InternalModelConfig) -> EngineName:
    """The engine `config` asks for; unset: vLLM where CUDA and vLLM are both here, or
    where an external vLLM server samples (`vllm_runtime`)."""
    if config.engine is not None:
        return config.engine
    if config.external_vllm is not None:
        return "vllm"
    from .vllm.server import find_vllm_python

    if find_vllm_python() is None:
        return "transformers"
    import torch

    return "vllm" if torch.cuda.is_available() else "transformers"


def check_supported(config: dev.InternalModelConfig, engine: EngineName) -> None:
    """Raise `ConfigError` for the first setting `engine` and the trainer cannot honour:
    the engine-neutral ones (`config_support.py`), then the engine's own (its `config.py`)."""
    from .config_support import check_engine_neutral

    check_engine_neutral(config)
    if engine == "vllm":
        from .vllm.config import check_config
    else:
        from .transformers.config import check_config
    check_config(config)


def require_engine(config: dev.InternalModelConfig) -> EngineName:
    """`choose_engine`, failing now (before minutes of loading) where it cannot start or
    cannot honour a field of `config` (`check_supported`)."""
    engine = choose_engine(config)
    check_supported(config, engine)
    if engine == "vllm" and config.external_vllm is None:  # else it is the server's
        from .vllm.server import require_vllm_python

        require_vllm_python()
    return engine


def start_engine(
    spec: EngineSpec, *, training_model: Any | None = None, thread: TorchThread | None = None
) -> Engine:
    """Start the engine `spec.config` asks for.

    `training_model`: the trainer's PEFT model in this process, which the transformers
    engine decodes from in shared mode; None where no trainer runs here (a Ray replica).
    `thread`: the torch thread an in-process engine decodes on (default: the process's).
    """
    if spec.config.external_vllm is not None:
        from .vllm.external import start_external_vllm_engine

        return start_external_vllm_engine(spec)
    if choose_engine(spec.config) == "vllm":
        from .vllm.engine import start_vllm_engine

        return start_vllm_engine(spec)
    from .transformers.engine import start_transformers_engine

    return start_transformers_engine(spec, training_model, thread)


__all__ = ["check_supported", "choose_engine", "require_engine", "start_engine"]
