"""`Model` (served elsewhere) and `TrainableModel` (served and trained by a backend)."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .backend import Backend, InferenceEndpoint
from .data import dev, observe
from .data.config_errors import ConfigModel, config_error
from .data.errors import ConfigError, ModelNotRegisteredError, NotBuiltError
from .data.log_checks import check_metrics, check_split
from .data.trajectories import Trajectory, TrajectoryGroup
from .data.types import TrainConfig, TrainSFTConfig
from .data.validation import coerce_groups
from .metrics.batch_metrics import group_costs, group_metrics
from .metrics.history_keys import batch_keys, qualify_metric_key, user_metric_keys
from .metrics.metrics_builder import MetricsBuilder
from .protocol_backend import ProtocolBackend
from .step_ledger import StepLedger
from .store.model_store import ModelStore
from .training import record, run_sft, run_step

if TYPE_CHECKING:
    from contextvars import Token

    from openai import AsyncOpenAI

# Names become directory names, and '@' separates a model from a step in inference names.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_NAME_FIX = "Use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"


# What a model registers with and calls: a backend taking these two model types.
ModelBackend: TypeAlias = "Backend[Model, TrainableModel]"


class Model(ConfigModel):
    """A model served elsewhere (an API model, or one you host), for rollouts and logging.

    Register it with a backend to log its trajectories next to a trained model's, to
    compare them.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str
    project: str
    entity: str | None = None
    id: str | None = None
    config: Any = None
    trainable: bool = False
    inference_api_key: str | None = None
    inference_base_url: str | None = None
    inference_model_name: str | None = None
    # ART's switch for metrics services: None sends them to W&B when WANDB_API_KEY is set,
    # ["wandb"] always (WANDB_MODE=offline keeps a local run), [] never.
    report_metrics: list[str] | None = None
    # ART's: where this model's own logs go while no backend stores them (an unregistered
    # model's `log`, a backend of ART's protocol): `<base_path>/<project>/models/<name>/`.
    base_path: str = ".art"

    # The backend it was registered with, its metrics builder, its step timing.
    _ledger: StepLedger = PrivateAttr(default_factory=StepLedger)
    _openai_client: AsyncOpenAI | None = PrivateAttr(default=None)
    _step_separator: str = PrivateAttr(default="@")
    _http_transport: Any = PrivateAttr(default=None)  # the backend's, for the OpenAI client
    _wandb_config: dict[str, Any] = PrivateAttr(default_factory=dict)  # update_wandb_config's

    @field_validator("name", "project")
    @classmethod
    def _check_name(cls, value: str, info: Any) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(f"{info.field_name} {value!r} is not a valid name. {_NAME_FIX}")
        return value

    @field_validator("report_metrics")
    @classmethod
    def _check_report_metrics(cls, value: list[str] | None) -> list[str] | None:
        for service in value or []:
            if service not in observe.REPORTERS:
                raise ValueError(
                    f"{service!r} is not a metrics service this version reports to; "
                    f"use {list(observe.REPORTERS)}, [] for none, or None for W&B when "
                    "WANDB_API_KEY is set"
                )
        return value

    @property
    def storage_name(self) -> str:
        """The model's durable name: its directory `<path>/<project>/models/<storage_name>/`,
        its checkpoints and its W&B run. `name` for a `Model`; a `TrainableModel`'s
        `run_name` (ART 0.5.23's), which is its `name` unless given."""
        return self.name

    def _storage_name(self) -> str:
        """ART 0.5.23's spelling of `storage_name`, which ART's backends call."""
        return self.storage_name

    # --- wiring ----------------------------------------------------------------------

    async def register(self, backend: ModelBackend | Any) -> None:
        """Bind this model to `backend`, which stores its logs (and, if trainable, serves it).

        `backend` is one of ours, or any object with ART's backend methods (`register`,
        `_get_step`, `_prepare_backend_for_training`, `_train_model`, ...), as a third
        party's integration writes one: the model drives it by ART's protocol.
        """
        await self._register(backend, None)

    async def _register(self, backend: object, server_config: Any) -> None:
        driven: ModelBackend
        if isinstance(backend, Backend):
            driven = backend
        else:  # a backend of ART's protocol (a third party's), driven by its methods
            driven = ProtocolBackend(backend, self, server_config, path=self.base_path)
        try:
            json.dumps(self.config)
        except (TypeError, ValueError) as error:
            raise ConfigError(
                "config",
                f"cannot be stored as JSON ({error})",
                "Use a dict of plain values, or a pydantic model's `.model_dump()`",
            ) from error
        endpoint = await driven.register(self)
        self._ledger.backend = driven
        if endpoint is not None:
            self._use_endpoint(endpoint)
        await asyncio.to_thread(self._ledger.read_totals, self.state_store())

    def _use_endpoint(self, endpoint: InferenceEndpoint) -> None:
        self.inference_base_url = endpoint.base_url
        self.inference_api_key = endpoint.api_key
        if endpoint.model_name is not None:
            self.inference_model_name = endpoint.model_name
        self._step_separator = endpoint.step_separator
        self._http_transport = endpoint.http_transport
        self._openai_client = None

    def backend(self) -> ModelBackend | Any:
        """The backend this model is registered with (the object given to `register`)."""
        if self._ledger.backend is None:
            raise ModelNotRegisteredError(self.name, "use a backend")
        if isinstance(self._ledger.backend, ProtocolBackend):
            return self._ledger.backend.driven
        return self._ledger.backend

    def openai_client(self) -> AsyncOpenAI:
        """An `AsyncOpenAI` client for this model's endpoint (one per model, reused).

        Its transport records this model's chat completions into the rollout being
        captured (`art.capture_auto_trajectory`), if any; requests for other models pass
        through unrecorded.
        """
        if self._openai_client is not None:
            return self._openai_client
        if self.inference_base_url is None:
            if self.trainable and self._ledger.backend is None:
                raise ModelNotRegisteredError(self.name, "give an OpenAI client")
            if self.trainable:
                raise NotBuiltError(
                    f"{type(self._ledger.backend).__name__} inference",
                    "this backend stores the model's logs but does not serve it yet",
                )
            raise ConfigError(
                "inference_base_url",
                f"model {self.name!r} has no inference endpoint",
                "Pass inference_base_url and inference_api_key to art.Model",
            )
        from openai import AsyncOpenAI

        from .capture.recording import RecordingAsyncTransport, served_as
        from .openai_http import openai_http, pool_limits

        # On the OpenAI SDK's own HTTP library (httpx2 from SDK 3 on: its connection pool
        # holds up under hundreds of concurrent rollouts, httpx's does not; see
        # `openai_http`), as is the backend's transport where it gives one.
        http = openai_http()
        recording: Any = RecordingAsyncTransport
        if http.__name__ == "httpx2":
            from .capture.recording_httpx2 import Httpx2RecordingAsyncTransport

            recording = Httpx2RecordingAsyncTransport
        transport = recording(
            self._http_transport or http.AsyncHTTPTransport(limits=pool_limits(http)),
            accepts=served_as(self),
        )
        self._openai_client = AsyncOpenAI(
            base_url=self.inference_base_url,
            api_key=self.inference_api_key or "none",
            timeout=1200.0,
            # A long rollout turn on a busy CPU engine is not a failure.
            http_client=http.AsyncClient(
                transport=transport, timeout=http.Timeout(1200.0, connect=10.0)
            ),
        )
        return self._openai_client

    def get_inference_name(self, step: int | None = None) -> str:
        """The `model` value for chat completions: the latest checkpoint, or `name@step`.

        For a model registered with a LocalBackend this is `project/name`, which routes to
        this model even where another project has a model of the same name; on the W&B
        Training API it is `wandb-artifact:///entity/project/name:step<step>`.
        """
        if isinstance(self._ledger.backend, ProtocolBackend):
            return self._ledger.backend.inference_name(self, step)
        base = self.inference_model_name or self.name
        return base if step is None else f"{base}{self._step_separator}{step}"

    def litellm_completion_params(self, step: int | None = None) -> dict[str, Any]:
        """Keyword arguments for `litellm.acompletion` that reach this model.

        A trainable model's name is given to LiteLLM's `hosted_vllm` provider, as ART
        does: our endpoint speaks vLLM's OpenAI API, and LiteLLM sends it the name as is.
        """
        name = self.get_inference_name(step)
        params: dict[str, Any] = {
            "model": f"hosted_vllm/{name}" if self.trainable else name,
            "base_url": self.inference_base_url,
            "api_key": self.inference_api_key,
        }
        if self.trainable:
            params["temperature"] = 1.0  # sample as in training, so logprobs match the policy
        return params

    # --- steps and logging ----------------------------------------------------------------

    async def get_step(self) -> int:
        """The current training step (0 for a model that is not trained here)."""
        if self._ledger.backend is None:
            if self.trainable:
                raise ModelNotRegisteredError(self.name, "report its step")
            return 0
        return await self._ledger.backend.get_step(self)

    async def log(
        self,
        trajectories: Iterable[TrajectoryGroup | Trajectory | BaseException] | None = None,
        split: str = "val",
        *,
        metrics: dict[str, float] | None = None,
        step: int | None = None,
    ) -> None:
        """Store trajectories (and/or extra metrics) under `split` for the current step.

        The Parquet file of the step holds every message, tool call, reward and metric;
        `history.jsonl` gets one row named as ART names it (`history_keys`): the averages
        under the split (`val/reward`, `val/exception_rate`, `val/group/<metric>`), the
        batch's counts as `val/data/step_*` (`data/step_*` for `train`), and each of
        `metrics` under the split unless it names a section or split (`loss/...`). A model
        with no backend registered writes them under `base_path`, as ART does (a trainable
        one then needs `step=`). `metrics={}` alone logs what the model's metrics builder
        holds for the split (its costs), and nothing if it holds nothing, as ART's does.
        """
        backend = self._log_backend()
        split = check_split(split)
        groups = [] if trajectories is None else coerce_groups(trajectories, "trajectories")
        if not groups and metrics is None:
            raise ConfigError(
                "trajectories",
                "nothing to log",
                "Pass trajectory groups, metrics=, or both (metrics={} logs what the model's "
                "metrics builder holds, as ART's does)",
            )
        check_metrics(metrics or {})
        row = batch_keys(split, group_metrics(groups)) if groups else {}
        costs = group_costs(groups)
        for key, value in (metrics or {}).items():
            if key.startswith("costs/"):  # summed by the builder, as ART's model.log does
                costs[key] = costs.get(key, 0.0) + float(value)
            else:
                row[qualify_metric_key(key, split)] = value
        builder = self._ledger.builder_for_split(split)
        for key, value in costs.items():
            builder.add_cost(key.removeprefix("costs/"), value)
        step = await self.get_step() if step is None else step
        await record(
            backend, self, groups, split, step, row, user_metric_keys(split, groups, metrics)
        )

    def metrics_builder(self, cost_context: str | None = None) -> MetricsBuilder:
        """This model's `MetricsBuilder` (`art.metrics`), or its view for `cost_context`.

        What it holds is flushed into the model's next `history.jsonl` row of the
        matching split: the `train` context at `log(split="train")` and `train`, `eval`
        at the `val` and `test` splits, any other context at the split of its name.
        """
        if cost_context is None:
            return self._ledger.builder
        return self._ledger.builder.for_cost_context(cost_context)

    def activate_metrics_context(self, cost_context: str) -> Token[MetricsBuilder]:
        """Record API costs (RULER's judge, AutoRL's generator, `track_api_cost`
        functions) into this model's builder under `cost_context` ("train", "eval"), in
        the current context; `token.var.reset(token)` ends it."""
        return self.metrics_builder(cost_context).activate()

    @property
    def ledger(self) -> StepLedger:
        """What this model carries between steps (its backend, metrics builder and step
        timing): the seam `art.core.training` records steps through."""
        return self._ledger

    def state_store(self) -> ModelStore:
        """Where the model's state lives: the store of its backend on this machine (a
        LocalBackend's `path`, a ServerlessBackend's local copy), else `base_path`'s."""
        path = getattr(self._ledger.backend, "path", None)
        if not isinstance(path, str | os.PathLike):
            path = self.base_path
        return ModelStore(path, self.project, self.storage_name)

    async def delete_checkpoints(
        self, best_checkpoint_metric: str = "val/reward"
    ) -> list[int] | None:
        """Delete every checkpoint but the latest and the one best on the given history metric.

        The best is the step whose `history.jsonl` rows average highest on the metric. As
        in ART, before that metric is recorded (at step 0, say) a note is printed and only
        the latest checkpoint is kept. Returns the deleted steps (None from a backend of
        ART's protocol, which does not say).
        """
        backend = self._ledger.registered_backend(self.name, "delete checkpoints")
        return await backend.delete_checkpoints(self, best_checkpoint_metric=best_checkpoint_metric)

    def update_wandb_config(self, config: dict[str, Any]) -> None:
        """Merge `config` into the config of this model's W&B run (ART 0.5.23's call).

        Before the run starts it is kept and given to the run when it does; after, the
        run's config is updated. As in ART a value once set may not change: nested dicts
        merge, and a key given another value raises `ConfigError` naming its path.
        """
        if not isinstance(config, dict):
            raise ConfigError(
                "config", f"expected a dict, got {type(config).__name__}", "Pass a dict"
            )
        try:
            json.dumps(config)
        except (TypeError, ValueError) as error:
            raise ConfigError(
                "config", f"cannot be stored as JSON ({error})", "Use plain values"
            ) from error
        self._wandb_config = _merge_unchanged(self._wandb_config, config, "config")
        observe.wandb_config_updated(self)

    @property
    def wandb_config(self) -> dict[str, Any]:
        """A copy of the config merged by `update_wandb_config` so far (what the model's
        W&B run is given)."""
        return copy.deepcopy(self._wandb_config)

    def _log_backend(self) -> ModelBackend:
        """The registered backend, or for a model with none (ART's frontend logging) the
        store under `base_path`."""
        if self._ledger.backend is not None:
            return self._ledger.backend
        from .local_log import StoreLog

        return cast("ModelBackend", StoreLog(self.base_path))


def _merge_unchanged(old: dict[str, Any], new: dict[str, Any], path: str) -> dict[str, Any]:
    """`old` with `new`'s keys added: dicts merged key by key, a value set differently refused."""
    merged = dict(old)
    for key, value in new.items():
        where = f"{path}[{key!r}]"
        if key not in merged:
            merged[key] = value
        elif isinstance(merged[key], dict) and isinstance(value, dict):
            merged[key] = _merge_unchanged(merged[key], value, where)
        elif merged[key] != value:
            raise ConfigError(
                where,
                f"is {value!r}, but the W&B config already holds {merged[key]!r}",
                "A W&B run's config does not change once set (as in ART): give a new key",
            )
    return merged


class TrainableModel(Model):
    """A model a backend serves and trains with GRPO on LoRA adapters.

    `base_model` is a Hugging Face model id, a local model directory, or a local LoRA
    adapter directory to start training from.
    """

    trainable: bool = True
    base_model: str
    # ART 0.5.23's: the run's durable name (its directory, checkpoints and W&B run), with
    # `name` the alias it is served under. None takes `name`.
    run_name: str | None = Field(default=None, validate_default=True)
    # ART 0.5.23's adapter settings (`art.dev.LoRAConfig`), read into _internal_config by
    # `dev.with_lora_config`, which names an unknown key with the keys there are.
    lora_config: dict[str, Any] | None = None

    _internal_config: dev.InternalModelConfig = PrivateAttr(default_factory=dev.InternalModelConfig)

    def __init__(
        self,
        *,
        name: str,
        project: str,
        base_model: str,
        entity: str | None = None,
        id: str | None = None,
        config: Any = None,
        _internal_config: dev.InternalModelConfig | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        # BaseModel's own __init__: the generated signature of Model has no base_model.
        try:
            BaseModel.__init__(
                self,
                name=name,
                project=project,
                base_model=base_model,
                entity=entity,
                id=id,
                config=config,
                **kwargs,
            )
        except ValidationError as error:
            raise config_error(type(self), error) from None
        if isinstance(_internal_config, dict):  # ART's InternalModelConfig is a dict
            _internal_config = dev.InternalModelConfig(**_internal_config)
        if _internal_config is not None:
            if not isinstance(_internal_config, dev.InternalModelConfig):
                raise ConfigError(
                    "_internal_config",
                    f"expected art.dev.InternalModelConfig, got {type(_internal_config).__name__}",
                    "Build it as art.dev.InternalModelConfig(...)",
                )
            self._internal_config = _internal_config
        if self.lora_config is not None:
            self._internal_config = dev.with_lora_config(self._internal_config, self.lora_config)

    @field_validator("run_name")
    @classmethod
    def _run_name_or_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return cast(str | None, info.data.get("name"))
        if not _NAME.fullmatch(value):
            raise ValueError(f"run_name {value!r} is not a valid name. {_NAME_FIX}")
        return value

    @property
    def storage_name(self) -> str:
        """`run_name`: the run's directory, checkpoints and W&B run; `name` is the alias
        the backend serves it under (`name`, `name@step`)."""
        return self.run_name or self.name

    @model_validator(mode="wrap")
    @classmethod
    def _read_internal_config(cls, data: Any, handler: Any) -> Any:
        # `TrainableModel.model_validate(model.model_dump())` keeps what the dump holds:
        # pydantic would drop the underscored key, and the model's config with it.
        internal = None
        from_dump = isinstance(data, dict) and "_internal_config" in data
        if from_dump:
            data = dict(data)
            internal = data.pop("_internal_config")
        model = handler(data)
        if internal is not None:
            model._internal_config = (
                internal
                if isinstance(internal, dev.InternalModelConfig)
                else dev.InternalModelConfig(**internal)
            )
        if from_dump and model.lora_config is not None:  # (__init__ reads it itself)
            model._internal_config = dev.with_lora_config(model._internal_config, model.lora_config)
        return model

    @field_validator("base_model")
    @classmethod
    def _check_base_model(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("base_model is empty; name a model such as 'Qwen/Qwen2.5-7B-Instruct'")
        return value

    @property
    def internal_config(self) -> dev.InternalModelConfig:
        return self._internal_config

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        """The model's fields and, as ART's dump has it, `_internal_config` (the fields set).

        A backend of ART's protocol sends this dump to its server, which reads the init,
        engine and trainer arguments from `_internal_config`.
        """
        data = super().model_dump(**kwargs)
        mode = kwargs.get("mode", "python")
        data["_internal_config"] = self._internal_config.model_dump(mode=mode, exclude_unset=True)
        return data

    async def register(
        self, backend: ModelBackend | Any, _openai_client_config: Any = None
    ) -> None:
        """Bind this model to `backend`, which serves, trains and stores it.

        `_openai_client_config` is ART's vLLM-server configuration (`art.dev.
        OpenAIServerConfig`): a backend of ART's protocol gets it in
        `_prepare_backend_for_training` (`art run` honours its host, port and api_key);
        our own backends run no such server, and refuse it rather than drop it.
        """
        if not isinstance(backend, Backend):
            await self._register(backend, _openai_client_config)
            return
        if _openai_client_config:
            raise ConfigError(
                "_openai_client_config",
                "configures ART's vLLM OpenAI server, which this version does not run",
                "Remove it; the endpoint is configured by _internal_config="
                "art.dev.InternalModelConfig(engine_args=art.dev.EngineArgs(max_num_seqs=..., "
                "max_model_len=...))",
            )
        await super().register(backend)

    async def train(
        self,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: TrainConfig | None = None,
        _config: dev.TrainConfig | None = None,
        verbose: bool = False,
    ) -> None:
        """Take one GRPO step on `trajectory_groups`; the next rollouts use the new weights.

        The groups are logged under the `train` split first; then the backend trains and
        saves checkpoint `step + 1`; then one row at `step` (`train/reward`, `loss/train`,
        `loss/grad_norm`, `data/step_*`, `time/step_backend_train_s`, ...: ART's names) is
        added to `history.jsonl`. Groups whose
        rewards are all equal teach nothing and are skipped, but the step still advances.
        """
        await run_step(self, trajectory_groups, config=config, dev_config=_config, verbose=verbose)

    async def train_sft(
        self,
        trajectories: Iterable[Trajectory],
        config: TrainSFTConfig | None = None,
        _config: dev.TrainSFTConfig | dict[str, Any] | None = None,
        verbose: bool = False,
        log_metrics: bool = True,
    ) -> None:
        """Supervised fine-tuning on the assistant turns of `trajectories` (ART's call).

        The trajectories are taken `config.batch_size` at a time, one optimizer step per
        batch at its learning rate (`config.learning_rate`: one rate, or one per batch);
        only the assistant's tokens (text and tool calls) count in the loss. Every
        trajectory is checked before any step runs (`SFTDataError` names each bad one).
        The same LoRA adapter RL trains is trained, saved as checkpoint `step + 1` and
        served at once, so `model.train` continues from it. `history.jsonl` gets one
        `sft/` row per batch (`sft/loss/train`, `sft/gradient_step`, tokens, seconds), none with
        `log_metrics=False`. `config.assistant_turns="last"` trains only each
        trajectory's final message (the assistant's), the turns before it context. The
        trajectories are read once, as they come: a generator need not fit in memory.
        """
        examples = ((f"trajectories[{i}]", t) for i, t in enumerate(trajectories))
        await run_sft(
            self,
            examples,
            config=config,
            dev_config=_config,
            verbose=verbose,
            log_metrics=log_metrics,
        )


__all__ = ["Model", "TrainableModel"]
