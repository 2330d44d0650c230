"""art: train LLM agents with GRPO inside the code they already live in.

    model = art.TrainableModel(name="agent-001", project="demo", base_model="...")
    await model.register(LocalBackend())
    groups = await art.gather_trajectory_groups(
        art.TrajectoryGroup(rollout(model, s) for _ in range(8)) for s in scenarios
    )
    await model.train(groups, config=art.TrainConfig(learning_rate=1e-5))

Names are loaded on first use, so `import art` is instant and pulls in no heavy library.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

from ._refusals import install as _install_refusals

__version__ = "0.1.0"

# ART's internal modules (its Megatron trainer, vLLM runtime, ...) are refused on import
# with the reason and what to use instead: docs/reference/art-names.md.
_install_refusals()

_EXPORTS: dict[str, str] = {
    "Trajectory": "art.core.data.trajectories",
    "TrajectoryGroup": "art.core.data.trajectories",
    "History": "art.core.data.trajectories",
    "PydanticException": "art.core.data.trajectories",
    "MetadataValue": "art.core.data.trajectories",
    "Message": "art.core.data.types",
    "MessageOrChoice": "art.core.data.types",
    "Messages": "art.core.data.types",
    "MessagesAndChoices": "art.core.data.types",
    "Tool": "art.core.data.types",
    "Tools": "art.core.data.types",
    "TrainConfig": "art.core.data.types",
    "TrainResult": "art.core.data.types",
    "TrainSFTConfig": "art.core.data.types",
    "LocalTrainResult": "art.core.data.types",
    "ServerlessTrainResult": "art.core.data.types",
    "Model": "art.core.model",
    "TrainableModel": "art.core.model",
    "Backend": "art.core.backend",
    "gather_trajectory_groups": "art.core.gather",
    "gather_trajectories": "art.core.gather",
    "trajectory_group_batches": "art.core.data.not_built",
    "iterate_dataset": "art.core.utils",
    "limit_concurrency": "art.core.utils",
    "retry": "art.core.utils",
    "ArtError": "art.core.data.errors",
    "ArtValueError": "art.core.data.errors",
    "BackendError": "art.core.data.errors",
    "ConfigError": "art.core.data.errors",
    "JudgeError": "art.core.data.errors",
    "ModelNotRegisteredError": "art.core.data.errors",
    "MetricDefinition": "art.core.metrics.metrics_builder",
    "PIPELINE_RL_DASHBOARD_DEFAULT_METRICS": "art.core.metrics.metrics_builder",
    "PIPELINE_RL_METRIC_DEFINITIONS": "art.core.metrics.metrics_builder",
    "PIPELINE_RL_SCORE_METRICS": "art.core.metrics.metrics_builder",
    "NotBuiltError": "art.core.data.errors",
    "LocalServingUnavailableError": "art.core.data.errors",
    "LoRAConfig": "art.core.data.dev",
    "get_tokenizer": "art.runtime.tokenizer",
    "tokenize": "art.runtime.art_tokenize",
    "tensorize": "art.runtime.art_tokenize",
    "RolloutError": "art.core.data.errors",
    "StorageError": "art.core.data.errors",
    "TrainingError": "art.core.data.errors",
    "TrajectoryValidationError": "art.core.data.errors",
    "LocalBackend": "art.backends.local",
    "ServerlessBackend": "art.backends.serverless",
    "PipelineTrainer": "art.pipeline",
    "PipelineAutotuneConfig": "art.pipeline_tuner.config",
    "PipelineRuntimeConfig": "art.pipeline_tuner.config",
    "auto_trajectory": "art.integrations.capture",
    "capture_auto_trajectory": "art.integrations.capture",
    "capture_callback": "art.integrations.langgraph.callbacks",
    "capture_http_client": "art.integrations.capture",
    "capture_sync_http_client": "art.integrations.capture",
    "capture_trace_config": "art.integrations.capture",
    "capture_requests_session": "art.integrations.capture",
    "current_trajectory": "art.core.capture.capture_scope",
    "no_capture": "art.core.capture.capture_scope",
    "trajectory": "art.core.capture.capture_scope",
    "trajectory_group": "art.core.capture.capture_scope",
    "yield_trajectory": "art.integrations.capture",
    "capture_yielded_trajectory": "art.integrations.capture",
}
_SUBMODULES = {
    "dev",
    "utils",
    "types",
    "trajectories",
    "gather",
    "model",
    "backend",
    "local",
    "serverless",
    "skypilot",
    "rewards",
    "langgraph",
    "mcp",
    "autorl",
    "ruler",
    "pipeline_trainer",
    "errors",
    "tokenizer",
    "metrics_taxonomy",
    "metrics",
    "costs",
    "api_costs",
}

__all__ = sorted([*_EXPORTS, "dev"])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"art.{name}")
    else:
        from ._refusals import refused_name

        return refused_name(__name__, name)  # ART's names not built here, or AttributeError
    globals()[name] = value
    return value


def _register_lazily(name: str) -> None:
    """`art.<name>` in `sys.modules` now, run on first use, and not bound on `art`.

    `auto_trajectory` and `yield_trajectory` are ART's names of both a module and a
    function. A submodule's first import sets its package's attribute to the module, so an
    `import art.auto_trajectory` after `art.auto_trajectory()` was called would replace the
    function with the module; a module already in `sys.modules` is not bound again.
    """
    spec = importlib.util.find_spec(f"art.{name}")
    assert spec is not None
    assert spec.loader is not None
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    loader.exec_module(module)


_register_lazily("auto_trajectory")
_register_lazily("yield_trajectory")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS, *_SUBMODULES])


if TYPE_CHECKING:
    from . import dev as dev
    from .backends.local import LocalBackend as LocalBackend
    from .backends.serverless import ServerlessBackend as ServerlessBackend
    from .core.backend import Backend as Backend
    from .core.capture.capture_scope import current_trajectory as current_trajectory
    from .core.capture.capture_scope import no_capture as no_capture
    from .core.capture.capture_scope import trajectory as trajectory
    from .core.capture.capture_scope import trajectory_group as trajectory_group
    from .core.data.dev import LoRAConfig as LoRAConfig
    from .core.data.errors import (
        ArtError as ArtError,
    )
    from .core.data.errors import (
        ArtValueError as ArtValueError,
    )
    from .core.data.errors import (
        BackendError as BackendError,
    )
    from .core.data.errors import (
        ConfigError as ConfigError,
    )
    from .core.data.errors import (
        JudgeError as JudgeError,
    )
    from .core.data.errors import LocalServingUnavailableError as LocalServingUnavailableError
    from .core.data.errors import (
        ModelNotRegisteredError as ModelNotRegisteredError,
    )
    from .core.data.errors import (
        NotBuiltError as NotBuiltError,
    )
    from .core.data.errors import (
        RolloutError as RolloutError,
    )
    from .core.data.errors import (
        StorageError as StorageError,
    )
    from .core.data.errors import (
        TrainingError as TrainingError,
    )
    from .core.data.errors import (
        TrajectoryValidationError as TrajectoryValidationError,
    )
    from .core.data.not_built import trajectory_group_batches as trajectory_group_batches
    from .core.data.trajectories import History as History
    from .core.data.trajectories import MetadataValue as MetadataValue
    from .core.data.trajectories import PydanticException as PydanticException
    from .core.data.trajectories import Trajectory as Trajectory
    from .core.data.trajectories import TrajectoryGroup as TrajectoryGroup
    from .core.data.types import LocalTrainResult as LocalTrainResult
    from .core.data.types import Message as Message
    from .core.data.types import MessageOrChoice as MessageOrChoice
    from .core.data.types import Messages as Messages
    from .core.data.types import MessagesAndChoices as MessagesAndChoices
    from .core.data.types import ServerlessTrainResult as ServerlessTrainResult
    from .core.data.types import Tool as Tool
    from .core.data.types import Tools as Tools
    from .core.data.types import TrainConfig as TrainConfig
    from .core.data.types import TrainResult as TrainResult
    from .core.data.types import TrainSFTConfig as TrainSFTConfig
    from .core.gather import gather_trajectories as gather_trajectories
    from .core.gather import gather_trajectory_groups as gather_trajectory_groups
    from .core.metrics.metrics_builder import (
        PIPELINE_RL_DASHBOARD_DEFAULT_METRICS as PIPELINE_RL_DASHBOARD_DEFAULT_METRICS,
    )
    from .core.metrics.metrics_builder import (
        PIPELINE_RL_METRIC_DEFINITIONS as PIPELINE_RL_METRIC_DEFINITIONS,
    )
    from .core.metrics.metrics_builder import PIPELINE_RL_SCORE_METRICS as PIPELINE_RL_SCORE_METRICS
    from .core.metrics.metrics_builder import MetricDefinition as MetricDefinition
    from .core.model import Model as Model
    from .core.model import TrainableModel as TrainableModel
    from .core.utils import iterate_dataset as iterate_dataset
    from .core.utils import limit_concurrency as limit_concurrency
    from .core.utils import retry as retry
    from .integrations.capture import auto_trajectory as auto_trajectory
    from .integrations.capture import capture_auto_trajectory as capture_auto_trajectory
    from .integrations.capture import capture_http_client as capture_http_client
    from .integrations.capture import capture_requests_session as capture_requests_session
    from .integrations.capture import capture_sync_http_client as capture_sync_http_client
    from .integrations.capture import capture_trace_config as capture_trace_config
    from .integrations.capture import capture_yielded_trajectory as capture_yielded_trajectory
    from .integrations.capture import yield_trajectory as yield_trajectory
    from .integrations.langgraph.callbacks import capture_callback as capture_callback
    from .pipeline import PipelineTrainer as PipelineTrainer
    from .pipeline_tuner.config import PipelineAutotuneConfig as PipelineAutotuneConfig
    from .pipeline_tuner.config import PipelineRuntimeConfig as PipelineRuntimeConfig
    from .runtime.art_tokenize import tensorize as tensorize
    from .runtime.art_tokenize import tokenize as tokenize
    from .runtime.tokenizer import get_tokenizer as get_tokenizer
