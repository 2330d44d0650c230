"""The model service: loads base models, serves them over HTTP, trains their adapters.

One `ModelService` holds every trainable model registered with a LocalBackend (or
`art serve`), keyed by `project/run_name` (a registration's `run_name`, else its `name`:
its store and the name its methods take) and served under `name`. Models that share a base model share its weights and its engine; each has
its own LoRA adapter (`registry.py`). Names route to an engine and an adapter:
`project/name` (the latest step) and `project/name@step` (any checkpoint on disk), which
is what `model.get_inference_name()` returns, and plain `name` / `name@step` while no
other project's model has that name. A checkpoint an engine must load is leased by the
request that uses it (`checkpoints.py`). A training step (`training.py`) has sole use
of its base's training model; the engine declares what it must stop for meanwhile
(`Engine.training()`): nothing in dedicated mode, where requests are answered while a
step trains.

Lock order, outermost first; a lock is never taken while holding one below it:
1. `_registry_lock` (this class): registering and unloading models and bases.
2. `LoadedBase.train_lock`: a change of a training model (adapter added or removed, a step).
3. `CheckpointCache._lock`: which checkpoints are loaded and leased (an adapter loads under it).
4. The engine's own locks (its pause; a child server's request table).
Jobs on the torch thread take only the engine's locks (4), so a caller may hold 1-3
while it waits for one.

It implements `ServiceAPI` (`api.py`), so a backend calls the same methods in this process,
with its groups and configs as the objects they are, or, through the typed proxy of
`art.runtime.process`, in a child process.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...core.data import dev
from ...core.data.arguments import parse_step
from ...core.data.errors import ConfigError
from ...core.data.registration import refuse_changed_config, refuse_changed_registration
from ...core.data.trajectories import TrajectoryGroup
from ...core.data.types import TrainConfig
from ...core.store.atomic import replace_dir_atomic
from ...core.store.model_store import ModelStore
from .. import models
from ..chat_format import chat_rendering
from ..endpoint.response import Route, no_release
from ..endpoint.server import build_app
from ..engines.base import Engine, EngineSpec
from ..engines.config_support import is_cpu_dedicated
from ..engines.start import require_engine, start_engine
from ..torch_thread import shared as torch_thread
from ..trainer.token_losses import TokenDatum
from . import token_training
from .checkpoints import CheckpointCache
from .placement import Placement, Trainer, TrainerSpec
from .registry import LoadedBase, TrainedModel, adapter_name, on_training_model, run_name_of
from .sft import train_sft
from .training import claim_writer_lock, publish, train_step

_SERVED_CHECKPOINTS = 4  # checkpoints kept loaded for `name@step` requests, unleased
# What models of one base share, and so must agree on: one engine, one training model.
_BASE_FIELDS = (
    "engine",
    "engine_args",
    "init_args",
    "trainer_backend",
    "trainer_gpu_ids",
    "inference_gpu_ids",
    "chat_template",
    "chat_template_path",
    "chat_template_kwargs",
    "chat_template_content_format",
    "chat_template_tool_schema_format",
    "rollout_weights_mode",
    "vllm_runtime",
)

logger = logging.getLogger("art.service")


class ModelService:
    """Serves and trains the trainable models of one LocalBackend (`path`).

    With a `placement`, its engines and trainers run there (a Ray cluster) instead of on
    the model this process loaded, which then only names adapters and renders prompts.
    `api_key` and `port` fix the endpoint's key and port (a new random key and a free
    port when not given): a service started again after its process died serves at the
    address its clients already hold.
    """

    def __init__(
        self,
        path: str,
        placement: Placement | None = None,
        *,
        api_key: str | None = None,
        port: int = 0,
    ) -> None:
        self.path = path
        self.placement = placement
        self.api_key = api_key or f"art-{secrets.token_urlsafe(24)}"
        self.port = port
        self._bases: dict[str, LoadedBase] = {}  # by resolved weights
        self._models: dict[str, TrainedModel] = {}  # by "project/name"
        self._adapter_ids = itertools.count()  # never reused, though models are unloaded
        self._registry_lock = threading.RLock()
        self._server: Any = None
        self._base_url: str | None = None
        self._torch = torch_thread()

    # --- registry -------------------------------------------------------------------------

    def register(self, record: dict[str, Any]) -> dict[str, str]:
        """Load (or reuse) the model's base and adapter; return its endpoint and served name."""
        with self._registry_lock:
            self.load(record)
            base_url = self._ensure_server()
        return {
            "base_url": base_url,
            "api_key": self.api_key,
            "model_name": served_name(record["project"], record["name"]),
        }

    def load(self, record: dict[str, Any]) -> None:
        """Load (or reuse) the model's base and adapter, without serving HTTP itself.

        A model loaded already must be registered with the config it was loaded with.
        `art serve` calls this: it serves the models on its own app.
        """
        with self._registry_lock:
            key = f"{record['project']}/{run_name_of(record)}"
            loaded = self._models.get(key)
            if loaded is not None and loaded.name != record["name"]:
                raise ConfigError(
                    "name",
                    f"run {key!r} is served as {loaded.name!r} by this backend, not "
                    f"{record['name']!r}",
                    f"Register it with name={loaded.name!r}, or close the backend first",
                )
            if loaded is not None:
                refuse_changed_registration(
                    {
                        "name": loaded.name,
                        "base_model": loaded.base_model,
                        "internal_config": loaded.config.model_dump(mode="json"),
                    },
                    record,
                    where="this backend",
                    loaded=True,
                )
                return
            self._refuse_shadowing(record)
            self._refuse_shared_route(record)
            self._models[key] = self._load_trained(record)

    def _refuse_shared_route(self, record: dict[str, Any]) -> None:
        """Two runs of one project may not be served under one name: requests for it
        would reach either."""
        for other in self._models.values():
            if (other.project, other.name) == (record["project"], record["name"]):
                raise ConfigError(
                    "run_name",
                    f"run {run_name_of(record)!r} would be served as "
                    f"{served_name(other.project, other.name)!r}, which this backend already "
                    f"serves for run {other.run_name!r}",
                    "Give this run another name (the alias it is served under), or close "
                    "the backend that serves the other run first",
                )

    def _refuse_shadowing(self, record: dict[str, Any]) -> None:
        """A base model's name always means the base: a trainable model may not be served
        under its own base's name or a loaded base's (on `art serve`, a tenant's adapter
        would answer every other tenant's requests for the base)."""
        full = served_name(record["project"], record["name"])
        if full in {record["base_model"], *self.base_names()}:
            raise ConfigError(
                "name",
                f"model {full!r} would be served under the name of a base model, which "
                "always means the base",
                "Pick another project or name for the trainable model",
            )

    def is_loaded(self, project: str, name: str) -> bool:
        return f"{project}/{name}" in self._models

    def loaded(self) -> list[tuple[str, str]]:
        """The (project, run name) of every model this service has loaded."""
        with self._registry_lock:
            return [(trained.project, trained.run_name) for trained in self._models.values()]

    def unload(self, project: str, name: str) -> None:
        """Stop serving and training a model: its checkpoints and adapter are unloaded.

        Requests already sampling finish; requests still waiting for it fail with
        `AdapterGone` (a 404 at the endpoint), never left waiting.
        """
        with self._registry_lock:
            trained = self._models.pop(f"{project}/{name}", None)
            if trained is None:
                return
            base = trained.base
            assert base.engine is not None
            base.checkpoints.drop(base.engine, trained.adapter)
            # An engine decoding from the training model fails the requests still waiting
            # for this adapter once it is gone (`AdapterGone`).
            on_training_model(base, lambda: base.model.delete_adapter(trained.adapter), self._torch)
            trained.trainer.close()
            # Held since its first step here: another process may train it now. Kept, the
            # hold would also make this process's next claim on a model recreated at the
            # same path succeed without locking the new lock file.
            if trained.writer_lock is not None:
                trained.writer_lock.release()
                trained.writer_lock = None

    def forget_deleted_checkpoints(self, project: str, name: str) -> None:
        """Stop serving checkpoints of a model whose directories were deleted."""
        trained = self._models.get(f"{project}/{name}")
        if trained is None:
            return
        base = trained.base
        assert base.engine is not None
        steps = set(trained.store.checkpoint_steps())
        base.checkpoints.drop(base.engine, trained.adapter, keep=lambda step: step in steps)

    def continue_from_latest(self, project: str, name: str) -> int:
        """Set the model's adapter and optimizer to its latest checkpoint, written from
        outside a step (a fork), and serve it; returns that step."""
        trained = self._registered(project, name)
        claim_writer_lock(trained)
        step = trained.store.step()
        directory = trained.store.checkpoint_dir(step)
        on_training_model(trained.base, lambda: trained.trainer.restore(directory), self._torch)
        trained.trained_step = step
        publish(trained, step)
        return step

    def engine_state(self) -> list[dict[str, Any]]:
        """Each loaded base's engine now (`ServiceAPI.engine_state`)."""
        with self._registry_lock:
            bases = list(self._bases.values())
        return [
            {
                "base_model": base.name,
                "engine": type(base.engine).__name__,
                "active_rows": base.engine.active_rows,
                "kv_cache_bytes": base.engine.kv_cache_bytes,
                "prefix_cache_bytes": base.engine.prefix_cache_bytes,
            }
            for base in bases
            if base.engine is not None
        ]

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        for trained in self._models.values():
            if trained.writer_lock is not None:
                trained.writer_lock.release()
            trained.trainer.close()
        for base in self._bases.values():
            if base.engine is not None:
                base.engine.close()
        # FastAPI's caches keep the endpoint's functions, and with them this service, alive
        # after the server stops: let go of the models so their memory is freed now.
        self._models.clear()
        self._bases.clear()
        from ..trainer.memory import release_free_memory

        release_free_memory()
        if self.placement is not None:
            self.placement.close()

    def _load_trained(self, record: dict[str, Any]) -> TrainedModel:
        from ..trainer.peft_trainer import PeftTrainer, add_adapter

        config = dev.InternalModelConfig(**(record.get("internal_config") or {}))
        require_engine(config)
        if self.placement is not None and config.trainer_backend == "unsloth":
            raise ConfigError(
                "_internal_config.trainer_backend",
                f"is 'unsloth', and this backend's trainers run on {type(self.placement).__name__}, "
                "whose trainer group trains with PEFT",
                "Use trainer_backend='peft' (or leave it unset) with this backend, or "
                "LocalBackend for the Unsloth trainer",
            )
        resolved = models.resolve(record["base_model"])
        base = self._base_for(resolved, config)
        tied = {"embed_tokens", "lm_head", "wte", "embed_in"} & set(config.peft_args.target_modules)
        if tied and base.engine is not None and base.engine.samples_merged:
            # The engine samples from one plain copy with the adapter merged in, where the
            # LM head and the embeddings may be one tied tensor.
            raise ConfigError(
                "peft_args.target_modules",
                f"{', '.join(sorted(tied))} cannot be adapted on {resolved.name}: its engine "
                "samples from a merged copy (started for a model registered before)",
                "Adapt other modules (Tinker: train_unembed=False), or serve this base with "
                "engine_args.merge_lora=False from its first model",
            )
        store = ModelStore(self.path, record["project"], run_name_of(record))
        start_from = (
            store.checkpoint_dir(store.step()) if store.checkpoint_steps() else resolved.adapter_dir
        )
        adapter = adapter_name(run_name_of(record), next(self._adapter_ids))

        def add() -> TrainedModel:
            base.model = add_adapter(
                base.model, adapter, config.peft_args, start_from, seed=config.trainer_args.seed
            )
            base.model.set_adapter(adapter)
            trainer: Trainer
            if config.trainer_backend == "unsloth":
                try:
                    trainer = self._unsloth_trainer(
                        base, resolved, config, adapter, store, start_from
                    )
                except BaseException:  # e.g. Unsloth refused the model: no adapter left behind
                    base.model.delete_adapter(adapter)
                    raise
            elif self.placement is not None:
                trainer = self.placement.start_trainer(
                    TrainerSpec(
                        resolved,
                        config,
                        adapter,
                        start_from,
                        latest_checkpoint=lambda: store.checkpoint_dir(store.step()),
                    )
                )
            else:
                trainer = PeftTrainer(
                    base.model,
                    base.tokenizer,
                    init_args=config.init_args,
                    trainer_args=config.trainer_args,
                    # The serving copy decodes in this process while the step trains.
                    overlaps_decoding=is_cpu_dedicated(config),
                )
                if start_from is not None:
                    trainer.load_optimizer(start_from)
            trained = TrainedModel(
                record["project"],
                record["name"],
                run_name_of(record),
                base,
                adapter,
                store,
                trainer,
                resolved.name,
                config,
                trained_step=store.step(),
            )
            if not store.checkpoint_steps():
                replace_dir_atomic(store.checkpoint_dir(0), trained.save)
            return trained

        trained = on_training_model(base, add, self._torch)
        if base.engine is None:
            base.engine = self._start_engine(base, resolved)
        publish(trained, store.step())  # served before it is routed
        return trained

    def _unsloth_trainer(
        self,
        base: LoadedBase,
        resolved: models.ResolvedModel,
        config: dev.InternalModelConfig,
        adapter: str,
        store: ModelStore,
        start_from: Path | None,
    ) -> Trainer:
        """The Unsloth trainer's child process for one model; every checkpoint it writes
        is loaded into this service's copy of the adapter, which the engine serves."""
        from ..trainer.peft_trainer import load_adapter_weights
        from ..trainer.unsloth_trainer import (
            UnslothSpec,
            UnslothTrainer,
            require_unsloth_python,
        )

        spec = UnslothSpec(
            python=require_unsloth_python(),
            weights=resolved.weights,
            dtype=str(base.model.dtype).removeprefix("torch."),
            config=config,
            log_path=Path(self.path) / "logs" / f"unsloth-{adapter}.log",
        )
        return UnslothTrainer(
            spec,
            start_from,
            latest_checkpoint=lambda: store.checkpoint_dir(store.step()),
            mirror=lambda directory: load_adapter_weights(base.model, adapter, directory),
        )

    def _base_for(
        self, resolved: models.ResolvedModel, config: dev.InternalModelConfig
    ) -> LoadedBase:
        """The loaded base `resolved` names, loaded now if it is not; its siblings' config
        must agree on what they share."""
        base = self._bases.get(resolved.weights)
        if base is not None:
            refuse_changed_config(
                base.config,
                config,
                fields=_BASE_FIELDS,
                what=f"the other models of {resolved.name!r} in this backend, which share "
                "its weights and engine",
                fix="Give this model the same settings for these fields, or use another "
                "LocalBackend path",
            )
            return base
        if is_cpu_dedicated(config):
            self._split_cores()
        base = self._torch.run(lambda: self._load_base(resolved, config))
        self._bases[resolved.weights] = base
        return base

    def _load_base(
        self, resolved: models.ResolvedModel, config: dev.InternalModelConfig
    ) -> LoadedBase:
        model, tokenizer = models.load(resolved, config.init_args.dtype, _training_device(config))
        context = int(getattr(model.config, "max_position_embeddings", 0) or 2048)
        context = min(context, config.engine_args.max_model_len or context)
        return LoadedBase(
            name=resolved.name,
            model=model,
            tokenizer=tokenizer,
            rendering=chat_rendering(config, tokenizer),
            context_length=context,
            config=config,
            train_lock=threading.Lock(),
            checkpoints=CheckpointCache(keep=_SERVED_CHECKPOINTS),
        )

    def _start_engine(self, base: LoadedBase, resolved: models.ResolvedModel) -> Engine:
        spec = EngineSpec(
            resolved,
            base.config,
            base.tokenizer,
            dtype=str(base.model.dtype).removeprefix("torch."),
            context_length=base.context_length,
            stop_token_ids=frozenset(_stop_token_ids(base.model, base.tokenizer)),
            log_dir=Path(self.path) / "logs",
            index=len(self._bases),
            # Leased checkpoints may outnumber `keep`; an engine swaps adapters beyond its slots.
            max_loras=_SERVED_CHECKPOINTS + 1,
        )
        if self.placement is not None:
            engine = self.placement.start_engine(spec)
        else:
            engine = start_engine(spec, training_model=base.model, thread=self._torch)
        logger.info(
            "serving %s: %s engine, %.2f GiB of weights of its own, %s while a step trains",
            resolved.name,
            type(engine).__name__,
            engine.memory_bytes() / 2**30,
            "answering" if engine.serves_while_training else "paused",
        )
        return engine

    def _split_cores(self) -> None:
        """Dedicated mode on the CPU: half the cores to the torch thread (decoding) and
        half to the training thread, set before either runs an op. Each thread that runs
        ops gets its own OpenMP team, sized by `set_num_threads` when it first runs one."""
        import torch

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = max(1, (cores or 2) // 2)
        torch.set_num_threads(threads)
        self._torch.run(lambda: torch.set_num_threads(threads))
        logger.info(
            "dedicated mode on the CPU: %d cores, %d torch threads for decoding and %d for "
            "training",
            cores,
            threads,
            threads,
        )

    def _ensure_server(self) -> str:
        if self._base_url is not None:
            return self._base_url
        import uvicorn

        app = build_app(self, self.api_key)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name="art-openai-server", daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                where = f" on port {self.port}" if self.port else ""
                raise RuntimeError(f"the OpenAI-compatible server did not start{where}")
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        self._server = server
        self._base_url = f"http://127.0.0.1:{port}/v1"
        return self._base_url

    # --- training -------------------------------------------------------------------------

    def train(
        self,
        project: str,
        name: str,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        dev_config: dev.TrainConfig,
    ) -> dict[str, float]:
        """One training step on checked `groups` (`model.train` and `art serve` check them
        first); the new adapter is saved as the next checkpoint and served."""
        trained = self._registered(project, name)
        _check_kl_reference(config, dev_config)
        return train_step(trained, groups, config, dev_config, self._torch)

    def train_sft(
        self,
        project: str,
        name: str,
        spool: str,
        learning_rate: float | list[float],
        batch_size: int,
        dev_config: dev.TrainSFTConfig,
    ) -> list[dict[str, float]]:
        """Supervised fine-tuning on the examples spooled at `spool` (checked first), one
        step per batch; the adapter is saved as the next checkpoint and served."""
        return train_sft(
            self._registered(project, name),
            Path(spool),
            learning_rate,
            batch_size,
            dev_config,
            self._torch,
        )

    # --- Tinker's calls (`art serve`'s Tinker API; `token_training.py`) ---------------------

    def forward_backward(
        self,
        project: str,
        name: str,
        datums: list[TokenDatum],
        loss_fn: str,
        loss_config: dict[str, float | str] | None,
        *,
        backward: bool,
    ) -> tuple[list[dict[str, list[float]]], dict[str, float]]:
        """Each datum's target logprobs and loss; with `backward`, gradients added."""
        return token_training.forward_backward(
            self._registered(project, name),
            datums,
            loss_fn,
            loss_config,
            backward=backward,
            torch_thread=self._torch,
        )

    def optim_step(self, project: str, name: str, adam: dict[str, float]) -> dict[str, float]:
        """One AdamW step on the gradients summed since the last (Tinker's AdamParams)."""
        return token_training.optim_step(self._registered(project, name), adam, self._torch)

    def save_state(self, project: str, name: str) -> int:
        """The adapter and optimizer saved as the next checkpoint and served; its step."""
        return token_training.save_checkpoint(self._registered(project, name), self._torch)

    def load_state(self, project: str, name: str, directory: Path, *, with_optimizer: bool) -> None:
        """The adapter (and optimizer) set to the checkpoint in `directory` (one of this
        model's, or of another model of the same base and rank)."""
        token_training.load_checkpoint(
            self._registered(project, name),
            directory,
            with_optimizer=with_optimizer,
            torch_thread=self._torch,
        )

    def prompt_logprobs(
        self, project: str, name: str, step: int | None, token_ids: list[int]
    ) -> list[float]:
        """Each token's logprob after the first under checkpoint `step` (None: the base)."""
        return token_training.prompt_logprobs(
            self._registered(project, name), step, token_ids, self._torch
        )

    def base_prompt_logprobs(self, base_model: str, token_ids: list[int]) -> list[float]:
        """Each token's logprob after the first under the loaded base `base_model` alone
        (its adapters off), scored by the trainer of a model on it."""
        base = self._loaded_base(base_model)
        on_it = [t for t in list(self._models.values()) if t.base is base]
        if not on_it:
            raise ConfigError(
                "base_model",
                f"{base_model!r} has no model on it left to score with",
                "Create a training client (register a model) on it first",
            )
        return token_training.prompt_logprobs(on_it[0], None, token_ids, self._torch)

    def base_stop_token_ids(self, base_model: str) -> set[int]:
        """The tokens the engine ends a sequence of the loaded base `base_model` on."""
        base = self._loaded_base(base_model)
        return _stop_token_ids(base.model, base.tokenizer)

    def _loaded_base(self, base_model: str) -> LoadedBase:
        for base in list(self._bases.values()):
            if base.name == base_model and base.engine is not None:
                return base
        loaded = ", ".join(repr(b.name) for b in self._bases.values()) or "none"
        raise ConfigError(
            "base_model",
            f"{base_model!r} is not loaded here (loaded: {loaded}); a base loads with the "
            "first model registered on it",
            "Create a training client (register a model) on it first, or name a loaded one",
        )

    def stop_token_ids(self, project: str, name: str) -> set[int]:
        """The tokens the engine ends a sequence on for the model."""
        base = self._registered(project, name).base
        return _stop_token_ids(base.model, base.tokenizer)

    def tokenizer_source(self, project: str, name: str) -> str:
        """Where the model's tokenizer loads from: its base model's name, or the local
        directory of the embedded default model (which the Hub does not hold offline)."""
        trained = self._registered(project, name)
        if trained.base_model == models.DEFAULT_MODEL:
            return str(models.default_model_dir())
        return trained.base_model

    def _registered(self, project: str, name: str) -> TrainedModel:
        trained = self._models.get(f"{project}/{name}")
        if trained is None:
            raise ConfigError(
                "model",
                f"{project}/{name} is not registered with this backend",
                "Register it first",
            )
        return trained

    # --- routing ----------------------------------------------------------------------------

    def route(self, model: str) -> Route:
        """Where `model` is served; a checkpoint the engine loads is leased to the caller
        until `Route.release()`."""
        for base in list(self._bases.values()):
            if model == base.name:
                return self._route(base, None)
        trained, step_text = self._find(model)
        if trained is None:
            raise KeyError(
                f"unknown model {model!r}; this endpoint serves {', '.join(self.model_names())}"
            )
        base = trained.base
        assert base.engine is not None
        step = parse_step(step_text)
        if base.engine.serves_training_weights:
            current = trained.store.step()
            if (not step_text or step == current) and not trained.unsaved:
                return self._route(base, trained.adapter, current)
            if not step_text:
                step_text, step = "latest", current
        elif not step_text:  # an engine with its own weights serves the latest published one
            latest = trained.published if trained.published is not None else trained.store.step()
            step_text, step = "latest", latest
        if step is None or step not in trained.store.checkpoint_steps():
            steps = ", ".join(str(s) for s in trained.store.checkpoint_steps())
            raise KeyError(
                f"model {served_name(trained.project, trained.name)!r} has no checkpoint "
                f"{step_text!r}; it has steps {steps}"
            )
        lease = base.checkpoints.lease(
            base.engine, trained.adapter, step, trained.store.checkpoint_dir(step)
        )
        return self._route(base, lease.adapter, step, lease.release)

    def _find(self, model: str) -> tuple[TrainedModel | None, str]:
        """The trainable model `model` names (`project/name` or a unique `name`), and its step.

        A base model's name is never a trainable model's (`_refuse_shadowing`); `route`
        looks for a base first, so one loaded later under a trained model's name wins.
        """
        reference, _, step_text = model.partition("@")  # names cannot contain '@'
        project, slash, name = reference.rpartition("/")
        trained = list(self._models.values())  # one C-level copy; no lock held while routing
        if slash:
            for candidate in trained:
                if (candidate.project, candidate.name) == (project, name):
                    return candidate, step_text
            return None, step_text
        matches = [candidate for candidate in trained if candidate.name == reference]
        if len(matches) > 1:
            full = ", ".join(repr(served_name(t.project, t.name)) for t in matches)
            raise KeyError(
                f"model name {reference!r} is ambiguous: projects "
                f"{', '.join(t.project for t in matches)} each have one. Use the full name "
                f"({full}), which model.get_inference_name() returns"
            )
        return (matches[0] if matches else None), step_text

    def _route(
        self,
        base: LoadedBase,
        adapter: str | None,
        step: int | None = None,
        release: Callable[[], None] = no_release,
    ) -> Route:
        assert base.engine is not None
        return Route(
            base.engine,
            base.tokenizer,
            base.rendering,
            adapter,
            base.context_length,
            step,
            release,
        )

    def base_names(self) -> list[str]:
        """The loaded base models, served under their own names."""
        return [base.name for base in self._bases.values()]

    def longest_context(self) -> int:
        return max((base.context_length for base in self._bases.values()), default=0)

    def model_names(self) -> list[str]:
        names = self.base_names()
        bases = set(names)
        trained = list(self._models.values())
        counts: dict[str, int] = {}
        for model in trained:
            counts[model.name] = counts.get(model.name, 0) + 1
        for model in trained:
            steps = model.store.checkpoint_steps()
            aliases = [served_name(model.project, model.name)]
            if counts[model.name] == 1 and model.name not in bases:  # else it means the base
                aliases.append(model.name)
            for alias in aliases:
                names.append(alias)
                names.extend(f"{alias}@{step}" for step in steps)
        return names


def served_name(project: str, name: str) -> str:
    """The name a trainable model is served under, unambiguous across projects."""
    return f"{project}/{name}"


def _training_device(config: dev.InternalModelConfig) -> str:
    """Where the training model lives: the trainer's GPU in dedicated mode, else the first."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{config.trainer_gpu_ids[0]}" if config.trainer_gpu_ids else "cuda"


def _stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, list):
        ids.update(configured)
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(end_of_turn, int) and end_of_turn != tokenizer.unk_token_id:
        ids.add(end_of_turn)
    return {i for i in ids if i is not None}


def _check_kl_reference(config: TrainConfig, objective: dev.TrainConfig) -> None:
    """A KL reference adapter is a LoRA directory, and a KL term takes it."""
    path = objective.kl_ref_adapter_path
    if path is None:
        return
    if not (Path(path) / "adapter_config.json").is_file():
        raise ConfigError(
            "kl_ref_adapter_path",
            f"{path!r} holds no LoRA adapter (adapter_config.json)",
            "Give a checkpoint directory of a model of this base (or kl_penalty_reference_step)",
        )
    if not (config.kl_penalty_coef > 0 or config.beta > 0):
        raise ConfigError(
            "kl_ref_adapter_path",
            "names the KL reference, but kl_penalty_coef and beta are 0, so none is taken",
            "Set kl_penalty_coef > 0 (e.g. 0.1), or leave the reference unset",
        )


__all__ = ["ModelService", "served_name"]
