"""ART's public modules and names that this version does not build, each with why and what
to use instead.

OpenPipe ART's wheels ship their internals as public modules (its Megatron trainer, its
vLLM runtime, its Tinker backends, its own tests). Importing one of those names here raises
`ModuleNotFoundError` saying what it is in ART and what to use instead, where a bare
"No module named ..." would leave an ART user guessing. `RefusedModuleFinder` is put at the
end of `sys.meta_path` by `import art`, so it only answers for `art.*` names that no file
provides. A refused name inside a module that is built (`REFUSED_NAMES`) is answered by
that module's `__getattr__` through `refused_name`, with a placeholder that raises
`NotBuiltError` (the reason) when called. docs/reference/art-names.md lists every module and
name with its state.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_LOCAL_RUNTIME = (
    "part of how ART's LocalBackend runs vLLM and its trainer; here that is art.runtime "
    "(engines, service, trainer), behind LocalBackend: use the backend, not its parts"
)

_VLLM_RUNTIME = (
    _LOCAL_RUNTIME + "; to sample with a vLLM server you run, give "
    "InternalModelConfig(vllm_runtime=art.dev.VllmRuntimeArgs(mode='external', "
    "server_url=...))"
)

_RUNTIME_DIAGNOSTICS = (
    "ART's inspection and installation of its managed vLLM and Megatron runtimes; here "
    "`art runtime status` and `art runtime prepare` (art.runtime.environments) inspect and "
    "build this version's environments (.venv-vllm, .venv-unsloth)"
)

_LANGGRAPH_LOGS = (
    "part of how ART's LangGraph wrapper works: it logs each model call to files and "
    "rebuilds the trajectory from them; here art.langgraph.wrap_rollout records each call "
    "(its exact token ids included) into the rollout's trajectory as it is made"
)

_CAPTURE_INTERNAL = (
    "part of ART's capture internals (its context object); here a rollout is recorded "
    "inside art.capture_auto_trajectory(...) or art.capture_yielded_trajectory(...)"
)

_EXCHANGES = (
    "part of ART 0.5.23's trajectory model not built here: its typed per-protocol "
    "histories, compact forms and multi-history tokenization; trajectory.histories() "
    "gives each captured conversation as an art.trajectories.History, and art.tokenize / "
    "art.tensorize tokenize single-history trajectories"
)

_DISTRIBUTED = (
    "ART's multi-node runtime (Monarch actors, etcd, NCCL and NIXL data planes); not "
    "built: RayBackend spreads inference replicas and a data-parallel trainer over nodes. "
    "Of it only art.distributed.rollout's RolloutExecutor and LocalRolloutExecutor are "
    "built (PipelineTrainer's rollout_executor=)"
)

_MEGATRON = (
    "ART 0.5.23's Megatron runtime settings; its Megatron trainer is not built (see "
    "art.megatron): train with LocalBackend or RayBackend"
)

_CLI = (
    "part of ART's Typer command line; ours is argparse: run the `art` command, or "
    "art.cli.main([...]) from Python (art.cli.main(['run', '--port', '7999']))"
)

_SKILLS = (
    "ART's command line copies its SKILL.md files for coding agents into a project; this "
    "version ships none (the docs site is its guide)"
)

_DEPLOYMENT = (
    "ART uploads a trained LoRA to Together AI or W&B Inference, hosted services this "
    "version never calls; serve a checkpoint yourself with `art serve`, or give vLLM its "
    "adapter directory, <path>/<project>/models/<name>/checkpoints/<step>"
)

_GATHER_INTERNAL = (
    "part of ART's gather internals (its progress-bar context); here "
    "art.gather_trajectory_groups and art.gather_trajectories run rollouts, count "
    "exceptions and show progress, and each trajectory's metrics reach the logs"
)

REFUSED: dict[str, str] = {
    "art.megatron": (
        "ART's Megatron-LM trainer for multi-GPU CUDA clusters (Megatron-Core, Transformer "
        "Engine, expert and context parallelism); instead, train with LocalBackend (PEFT or "
        "Unsloth on one machine) or RayBackend (data-parallel)"
    ),
    "art.distributed": _DISTRIBUTED,
    "art.trainer_rank": "ART's per-rank Megatron trainer internals (see art.megatron)",
    "art.weight_transfer": (
        "ART's NCCL weight transfer from trainer GPUs to vLLM; here each checkpoint reaches "
        "the engine as a LoRA adapter directory"
    ),
    "art.tinker": (
        "ART's backend on Thinking Machines' hosted Tinker service, which this version never "
        "calls; use LocalBackend, or ServerlessBackend against `art serve`"
    ),
    "art.tinker_native": (
        "ART's native backend on Thinking Machines' hosted Tinker service, which this version "
        "never calls; use LocalBackend, or ServerlessBackend against `art serve`"
    ),
    "art.tau_bench": (
        "ART's client for the tau-bench benchmark harness of its own experiments; not part of "
        "the training API here"
    ),
    "art.test": "ART's own tests, shipped in its wheel; not an API",
    "art.preprocessing": (
        "ART's internal tokenizing and packing of trajectories for its trainers; here "
        "art.runtime.trainer does it from the endpoint's exact token ids"
    ),
    "art.transformers": (
        "ART's patches of Hugging Face transformers; this version patches no third-party code"
    ),
    "art.unsloth": (
        "ART's Unsloth service internals; here Unsloth is one trainer behind art.runtime's "
        "trainer seam (InitArgs / `make venv-unsloth`), reached through LocalBackend"
    ),
    "art.vllm_runtime": _VLLM_RUNTIME,
    "art.vllm_route_transport": _LOCAL_RUNTIME,
    "art.serving_capabilities": _LOCAL_RUNTIME,
    "art.runtime_diagnostics": _RUNTIME_DIAGNOSTICS,
    "art.adapter_leases": _LOCAL_RUNTIME,
    "art.local.adapter_leases": _LOCAL_RUNTIME,
    "art.local.service": _LOCAL_RUNTIME,
    "art.local.checkpoints": _LOCAL_RUNTIME,
    "art.token_prefix": _LOCAL_RUNTIME,
    "art.utils.deploy_model": _DEPLOYMENT,
    "art.utils.deployment": _DEPLOYMENT,
    "art.utils.record_provenance": (
        "ART marks a W&B artifact's metadata through W&B's API, which this version never "
        "calls (checkpoints are local files, or art serve's); nothing is recorded"
    ),
    "art.langgraph.logging": _LANGGRAPH_LOGS,
    "art.trajectories.tensors": _EXCHANGES,
    "art.langgraph.message_utils": _LANGGRAPH_LOGS,
    "art.guided_completion": (
        "ART's vLLM guided-decoding parameters that force a tool call's schema; here the "
        "endpoint constrains output with `response_format` (a JSON schema) and tool calls "
        "are parsed from the model's own text"
    ),
    "art.loss": (
        "ART's trainer loss over its packed tensors; ours is art.runtime.trainer.loss "
        "(pure functions: grpo_loss with PPO's or CISPO's surrogate), reached through "
        "backend.train(..., loss_fn=...)"
    ),
    "art.serverless.client": (
        "ART's typed HTTP client of W&B's Training API; here ServerlessBackend speaks that "
        "protocol itself, against W&B's service or `art serve`"
    ),
    "art.pipeline_trainer.binary_prefix_tool_pipeline": (
        "an example script of ART's, shipped in its wheel; ours are examples/pipeline.py "
        "and examples/*.py"
    ),
    "art.pipeline_trainer.yes_no_maybe_pipeline": (
        "an example script of ART's, shipped in its wheel; ours are examples/pipeline.py "
        "and examples/*.py"
    ),
    "art.utils.chat_template": (
        "ART's chat-template helpers for its renderers; here the endpoint renders chat "
        "templates (art.runtime.chat_format)"
    ),
    "art.utils.model_config": (
        "ART's per-model chat-template and training defaults for its own trainers; here "
        "InternalModelConfig's init_args, engine_args and trainer_args set them"
    ),
    "art.utils.convert_moe_lora": (
        "ART's conversion of fused mixture-of-experts LoRA adapters for vLLM; this version "
        "trains LoRA on dense models only"
    ),
    "art.utils.safetensors": _LOCAL_RUNTIME,
    "art.utils.managed_process": _LOCAL_RUNTIME,
    "art.utils.lifecycle": _LOCAL_RUNTIME,
    "art.utils.network": _LOCAL_RUNTIME,
    "art.utils.wandb_sdk": (
        "ART's wrapper of W&B's SDK for its hosted runs; here `report_metrics` and "
        "art.integrations.observability send history.jsonl rows to W&B"
    ),
    "art.utils.suppress_litellm_serialization_warnings": (
        "ART's filter of LiteLLM's pydantic warnings at import; this version changes no "
        "warning filters of other libraries"
    ),
    "art.utils.logging": ("ART's coloured console helpers for its own messages; not an API here"),
    "art.utils.grpo": (
        "ART's internal check that a group's rewards differ; here `trainable_groups` in "
        "each step's metrics counts them"
    ),
}


REFUSED_NAMES: dict[str, str] = {
    **{
        f"{module}.BackendModelConfig": (
            "ART 0.5.23's InternalModelConfig with lora_config inside; here lora_config is "
            "TrainableModel(lora_config=art.LoRAConfig(...)), beside _internal_config"
        )
        for module in ["art.dev", "art.dev.model"]
    },
    "art.dev.model.PEFT_ARGS_MIGRATION_MESSAGE": (
        "ART 0.5.23 replaced PeftArgs by lora_config; here both work: "
        "InternalModelConfig(peft_args=PeftArgs(...)) and TrainableModel(lora_config=...)"
    ),
    "art.dev.engine.WeightTransferConfig": (
        "ART's settings for NCCL weight transfer to vLLM; here each checkpoint reaches the "
        "engine as a LoRA adapter directory"
    ),
    "art.dev.get_model_config.default_target_modules": (
        "ART's LoRA target modules per model family; here they are "
        "InternalModelConfig().peft_args's target_modules, or lora_config's"
    ),
    "art.types.SFTMetricLoggingConfig": (
        "ART's internal field of dev.TrainSFTConfig; to train without logging, call "
        "model.train_sft(..., log_metrics=False)"
    ),
    **{
        f"art.trajectories.{name}": _EXCHANGES
        for name in [
            "AnthropicMessageSource",
            "AnthropicMessagesHistory",
            "ChatCompletionsHistory",
            "ChatCompletionsMessageSource",
            "ChatCompletionsRequest",
            "CompactDumpable",
            "CompactTrajectoryKind",
            "CompactTrajectoryPayload",
            "CompletionsRequest",
            "CompletionsSource",
            "CompletionsStringHistory",
            "CompletionsStringSourceSpan",
            "CompletionsTokenHistory",
            "CompletionsTokenSourceSpan",
            "LegacyHistory",
            "MessagesRequest",
            "ResponsesHistory",
            "ResponsesItemSource",
            "ResponsesRequest",
            "TensorizedMultiHistoryTrajectory",
            "TensorizedTopK",
            "TokenizedMultiHistoryTrajectory",
            "TokenizedTopK",
            "Tokenizer",
            "TrajectoryHistory",
            "compact_dump",
            "compact_memory",
            "compact_validate",
            "compact_validate_json",
            "first_occurrence_masks",
        ]
    },
    **{
        f"{module}.{name}": _MEGATRON
        for module, name in [
            ("art", "MegatronRuntimeConfig"),
            ("art", "MegatronTopologyConfig"),
            ("art", "get_megatron_runtime_config"),
            ("art", "init_megatron_runtime_config"),
            ("art.types", "MegatronRuntimeConfig"),
            ("art.types", "MegatronTopologyConfig"),
        ]
    },
    "art.pipeline_tuner.attachment.VllmMetricPollHealth": (
        "the health record of ART's timed polls of vLLM's metrics endpoint; our engines "
        "expose no such gauge: feed readings to "
        "PipelineAutotunerAttachment.on_vllm_pressure_sample"
    ),
    **{
        f"art.distributed.{name}": (
            "a name ART's art.distributed imports for its own use, not part of its API"
        )
        for name in ["Any", "TYPE_CHECKING", "import_module"]
    },
    **{
        f"art.distributed.rollout.{name}": _DISTRIBUTED
        for name in [
            "DistributedRolloutExecutor",
            "DistributedTrajectoryQueue",
            "DistributedTrajectorySelection",
            "InProcessRolloutWorker",
            "InstalledAsyncCallable",
            "RolloutInvocation",
            "RolloutModelSpec",
            "RolloutResult",
            "RolloutWorkerEndpoint",
            "TrajectoryQueueEndpoint",
            "apportion_rollout_workers",
        ]
    },
    "art.pipeline_trainer.trainer.PIPELINE_STATE_KEY": (
        "ART keeps a pipeline's state under this key of the model's state; here it is "
        "<model dir>/pipeline_state.json (art.pipeline_trainer.state.PipelineState)"
    ),
    **{f"art.cli.{name}": _CLI for name in ["app", "run", "migrate", "runtime_app"]},
    **{
        f"art.cli.{name}": _SKILLS
        for name in ["SKILL_NAMES", "init", "install_skills", "help_command"]
    },
    **{
        f"art.langgraph.llm_wrapper.{name}": _LANGGRAPH_LOGS
        for name in [
            "CURRENT_CONFIG",
            "DEFAULT_INVOKE_TIMEOUT",
            "LoggingLLM",
            "OPENAI_COMPATIBLE_PROVIDERS",
            "add_thread",
            "create_messages_from_logs",
            "mappings",
        ]
    },
    "art.openai.ART_MOE_ROUTING_METADATA_KEY": (
        "ART's key for mixture-of-experts routing data in a completion; this version trains "
        "LoRA on dense models only"
    ),
    "art.auto_trajectory.AutoTrajectoryContext": _CAPTURE_INTERNAL,
    "art.auto_trajectory.auto_trajectory_context_var": _CAPTURE_INTERNAL,
    "art.auto_trajectory.patch_httpx": (
        "ART 0.5.18 captures by patching httpx; this version patches no third-party code: "
        "clients from model.openai_client() and art.capture_http_client() record through "
        "an httpx transport"
    ),
    "art.auto_trajectory.parse_sse_to_chat_completion": (
        "ART's parser of a streamed response body; read a stream with "
        "art.openai.consume_chat_completion_stream(stream) instead"
    ),
    "art.yield_trajectory.YieldTrajectoryContext": _CAPTURE_INTERNAL,
    "art.yield_trajectory.yield_trajectory_context_var": _CAPTURE_INTERNAL,
    **{
        f"art.gather.{name}": _GATHER_INTERNAL
        for name in [
            "GatherContext",
            "gather_context_var",
            "get_gather_context",
            "record_metrics",
            "set_gather_context",
            "wrap_group_awaitable",
            "wrap_trajectories_awaitable",
            "record_trajectory_completion_tokens",
        ]
    },
}


def refused_name(module: str, name: str) -> Any:
    """A placeholder for `module.name` if it is refused, else the usual AttributeError.

    Modules of ART's paths use it as their `__getattr__`, so `from art.x import y` of a name
    this version does not build imports, and says why the moment it is used.
    """
    reason = REFUSED_NAMES.get(f"{module}.{name}")
    if reason is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    from .core.data.not_built import not_built_function  # here: `import art` stays light

    return not_built_function(f"{module}.{name}", reason)


def refusal(name: str) -> str | None:
    """Why module `name` is refused (from its own entry or a parent package's), or None."""
    parts = name.split(".")
    for end in range(len(parts), 1, -1):
        reason = REFUSED.get(".".join(parts[:end]))
        if reason is not None:
            return reason
    return None


class RefusedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers imports of a refused `art.*` module with the reason, as ModuleNotFoundError."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        reason = refusal(fullname) if fullname.startswith("art.") else None
        if reason is None:
            return None
        raise ModuleNotFoundError(f"{fullname} is not built here: {reason}", name=fullname)


def install() -> None:
    """Put one `RefusedModuleFinder` last on `sys.meta_path` (once per process)."""
    import sys

    if not any(isinstance(finder, RefusedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(RefusedModuleFinder())


__all__ = ["REFUSED", "REFUSED_NAMES", "RefusedModuleFinder", "install", "refusal", "refused_name"]
