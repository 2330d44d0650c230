"""The model service: loads base models, serves them over HTTP, trains their adapters.

One `ModelService` holds every trainable model registered with a LocalBackend. Models
that share a base model share its weights: each gets its own LoRA adapter in one PEFT
model, while the base itself is served under its own name. Decoding and training take
turns on one lock per base model (shared mode), or, in dedicated mode on the CPU
(`trainer_gpu_ids=[]`, `inference_gpu_ids=[]`), the engine decodes from a serving copy of
the weights holding published checkpoints while the trainer trains its own copy, each in
its own thread, so rollouts never wait for a step.

A trainable model is identified by (project, name): two projects may each have a model
called `agent`. It is served as `project/name` (the latest step) and
`project/name@step` (any checkpoint on disk), which is what `model.get_inference_name()`
returns, and also as plain `name` / `name@step` while no other project's model has that
name; once one does, the plain name is refused with an error that lists the full names.

Its torch work (loading, adding adapters, shared-mode training steps) runs on the
process's torch thread, where the transformers engine decodes too (`torch_thread.py`
says why one thread). A job there never takes this module's locks: callers hold those
while they wait for it.

Its methods take and return plain JSON-like values, so the same object can be called
in this process or, through `art.backends.local.process`, in a child process.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ....core import dev
from ....core.errors import ConfigError
from ....core.storage import ModelStore, replace_dir_atomic
from ....core.trajectories import TrajectoryGroup
from ....core.types import TrainConfig
from ....core.validation import check_trainable
from .. import models
from ..endpoint.chat_format import tool_template_for
from ..endpoint.server import Route, build_app
from ..engines.base import Engine, EngineName, choose_engine
from ..torch_thread import shared as torch_thread
from .config_support import check_supported, is_cpu_dedicated, mergeable
from .placement import EngineSpec, Placement, Trainer, TrainerSpec

_SERVED_CHECKPOINTS = 4  # older checkpoints kept loaded for `name@step` requests
_SERVING_PLACEHOLDER = "serving_copy"  # makes the serving copy a PeftModel; never selected

logger = logging.getLogger("art.service")
T = TypeVar("T")


@dataclass
class _Base:
    """One loaded base model and everything that shares its weights."""

    name: str
    model: Any  # a PeftModel once the first adapter exists
    tokenizer: Any
    chat_template: str | None
    context_length: int
    lock: threading.Lock  # the training model's
    engine_name: EngineName
    dedicated: bool = False  # the engine has its own weights and keeps serving while we train
    engine: Engine | None = None
    checkpoints: OrderedDict[str, Path] = field(default_factory=OrderedDict)
    checkpoints_lock: threading.Lock = field(default_factory=threading.Lock)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Sole use of the model: the engine stops admitting requests and drains first.

        In dedicated mode the engine decodes from its own copy, so only the training
        model's lock is taken and serving goes on.
        """
        if self.dedicated:
            with self.lock:
                yield
            return
        with contextlib.ExitStack() as stack:
            if self.engine is not None:
                stack.enter_context(self.engine.paused())
            if self.engine is None or not self.engine.serves_training_weights:
                stack.enter_context(self.lock)  # the engine's pause did not take it
            yield

    def select_adapter(self, adapter: str | None) -> contextlib.AbstractContextManager[None]:
        if adapter is None:
            if hasattr(self.model, "disable_adapter"):
                return self.model.disable_adapter()  # type: ignore[no-any-return]
            return contextlib.nullcontext()
        self.model.set_adapter(adapter)
        return contextlib.nullcontext()


@dataclass
class _Trained:
    """A registered trainable model."""

    project: str
    name: str
    base: _Base
    adapter: str
    store: ModelStore
    trainer: Trainer
    base_model: str  # as the user named it
    published: int | None = None  # the newest step loaded into an engine with its own weights

    def save(self, directory: Path) -> None:
        self.trainer.save(directory)
        # Name the base as the user did, not by our cache path, so the checkpoint loads as
        # a `base_model` wherever that name resolves.
        config_path = directory / "adapter_config.json"
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = self.base_model
        config_path.write_text(json.dumps(config, indent=2))


class ModelService:
    """Serves and trains the trainable models of one LocalBackend (`path`).

    With a `placement`, its engines and trainers run there (a Ray cluster) instead of on
    the model this process loaded, which then only names adapters and renders prompts.
    """

    def __init__(self, path: str, placement: Placement | None = None) -> None:
        self.path = path
        self.placement = placement
        self.api_key = f"art-{secrets.token_urlsafe(24)}"
        self._bases: dict[str, _Base] = {}
        self._models: dict[str, _Trained] = {}
        self._adapter_ids = itertools.count()  # never reused, though models are unloaded
        self._registry_lock = threading.RLock()
        self._server: Any = None
        self._base_url: str | None = None
        self._torch = torch_thread()

    # --- lifecycle ----------------------------------------------------------------------

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

        `art serve` calls this: it serves the models on its own app.
        """
        with self._registry_lock:
            key = f"{record['project']}/{record['name']}"
            if key not in self._models:
                self._models[key] = self._load_trained(record)

    def is_loaded(self, project: str, name: str) -> bool:
        return f"{project}/{name}" in self._models

    def unload(self, project: str, name: str) -> None:
        """Stop serving and training a model: drop its adapter and loaded checkpoints."""
        with self._registry_lock:
            trained = self._models.pop(f"{project}/{name}", None)
            if trained is None:
                return
            base = trained.base
            assert base.engine is not None
            with base.checkpoints_lock:
                served = [a for a in base.checkpoints if a.startswith(f"{trained.adapter}_step")]
                for adapter in served:
                    del base.checkpoints[adapter]
            for adapter in served:  # each waits for its in-flight requests
                base.engine.unload_adapter(adapter)
            self._exclusive(base, lambda: base.model.delete_adapter(trained.adapter))

    def forget_deleted_checkpoints(self, project: str, name: str) -> None:
        """Stop serving checkpoints of a model whose directories were deleted."""
        trained = self._models.get(f"{project}/{name}")
        if trained is None:
            return
        base = trained.base
        assert base.engine is not None
        with base.checkpoints_lock:
            gone = [
                adapter
                for adapter, directory in base.checkpoints.items()
                if adapter.startswith(f"{trained.adapter}_step") and not directory.exists()
            ]
            for adapter in gone:
                del base.checkpoints[adapter]
        for adapter in gone:
            base.engine.unload_adapter(adapter)

    def _exclusive(self, base: _Base, work: Callable[[], T]) -> T:
        """`work()` with sole use of `base`'s training model (`_Base.exclusive`): on the
        torch thread in shared mode; on this thread in dedicated mode, where the torch
        thread decodes from the serving copy meanwhile."""

        def held() -> T:
            with base.exclusive():
                return work()

        return held() if base.dedicated else self._torch.run(held)

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        for base in self._bases.values():
            if base.engine is not None:
                base.engine.close()
        if self.placement is not None:
            self.placement.close()

    def _load_trained(self, record: dict[str, Any]) -> _Trained:
        from ..trainer.peft_trainer import PeftTrainer, add_adapter

        config = dev.InternalModelConfig(**(record.get("internal_config") or {}))
        engine_name = choose_engine(config)
        check_supported(config, engine_name)
        if engine_name == "vllm":
            from ..engines.vllm.server import require_vllm_python

            require_vllm_python()  # before minutes of loading: say how to install it
        resolved = models.resolve(record["base_model"])
        if is_cpu_dedicated(config):
            self._split_cores()
        base = self._torch.run(lambda: self._load_base(resolved, config, engine_name))
        store = ModelStore(self.path, record["project"], record["name"])
        step = store.step()
        start_from = (
            store.checkpoint_dir(step) if store.checkpoint_steps() else resolved.adapter_dir
        )
        adapter = _adapter_name(record["name"], next(self._adapter_ids))

        def add() -> _Trained:
            base.model = add_adapter(
                base.model, adapter, config.peft_args, start_from, seed=config.trainer_args.seed
            )
            base.model.set_adapter(adapter)
            trainer: Trainer
            if self.placement is not None:
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
                peft_trainer = PeftTrainer(
                    base.model,
                    base.tokenizer,
                    init_args=config.init_args,
                    trainer_args=config.trainer_args,
                )
                if start_from is not None:
                    peft_trainer.load_optimizer(start_from)
                trainer = peft_trainer
            trained = _Trained(
                record["project"], record["name"], base, adapter, store, trainer, resolved.name
            )
            if not store.checkpoint_steps():
                replace_dir_atomic(store.checkpoint_dir(0), trained.save)
            return trained

        trained = self._exclusive(base, add)
        if base.engine is None:
            base.engine = self._start_engine(base, resolved, config)
        if not base.engine.serves_training_weights:
            self._publish(trained, store.step())  # published before it is routed
        return trained

    def _start_engine(
        self, base: _Base, resolved: models.ResolvedModel, config: dev.InternalModelConfig
    ) -> Engine:
        stop_token_ids = _stop_token_ids(base.model, base.tokenizer)
        if self.placement is not None:
            return self.placement.start_engine(
                EngineSpec(
                    resolved,
                    config,
                    base.tokenizer,
                    dtype=str(base.model.dtype).removeprefix("torch."),
                    context_length=base.context_length,
                    stop_token_ids=frozenset(stop_token_ids),
                )
            )
        if base.engine_name == "vllm":
            from ..engines.vllm.engine import start_vllm_engine

            return start_vllm_engine(
                resolved,
                base.tokenizer,
                config,
                dtype=str(base.model.dtype).removeprefix("torch."),
                context_length=base.context_length,
                stop_token_ids=stop_token_ids,
                log_path=Path(self.path) / "logs" / f"vllm-{len(self._bases)}.log",
                max_loras=_SERVED_CHECKPOINTS + 1,  # one more is loaded before the oldest goes
            )
        from ..engines.transformers.engine import TransformersEngine

        if base.dedicated:
            return self._torch.run(
                lambda: self._start_serving_copy(base, resolved, config, stop_token_ids)
            )
        return self._torch.run(
            lambda: TransformersEngine(
                base.model,
                base.tokenizer,
                max_num_seqs=config.engine_args.max_num_seqs,
                model_lock=base.lock,
                select_adapter=base.select_adapter,
                stop_token_ids=stop_token_ids,
                merged=self._merged_copy(base.model, resolved, config),
                torch_thread=self._torch,
            )
        )

    def _merged_copy(
        self, served: Any, resolved: models.ResolvedModel, config: dev.InternalModelConfig
    ) -> Any:
        """A plain copy to sample `served`'s adapters from (`EngineArgs.merge_lora`), or None."""
        from ..engines.transformers.merged import MergedCopy
        from ..trainer.memory import budget

        device = _training_device(config)
        wanted = config.engine_args.merge_lora
        if wanted is None:
            size = sum(p.numel() * p.element_size() for p in served.parameters())
            free = budget(served.device, None).available
            wanted = (
                device == "cpu" and mergeable(config.peft_args.target_modules) and size < free // 4
            )
        if not wanted:
            return None
        plain, _ = models.load(resolved, config.init_args.dtype, device)
        plain.requires_grad_(False)
        return MergedCopy(served, plain)

    def _split_cores(self) -> None:
        """Dedicated mode on the CPU: half the cores to the torch thread (decoding) and
        half to this thread (training), set before either runs an op. Each thread that runs
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

    def _start_serving_copy(
        self,
        base: _Base,
        resolved: models.ResolvedModel,
        config: dev.InternalModelConfig,
        stop_token_ids: set[int],
    ) -> Engine:
        """Dedicated mode on the CPU: an engine over a second copy of the base weights.

        The copy serves checkpoints loaded by name (as vLLM does), so the trainer's copy
        can train while it decodes. Runs on the torch thread, which decodes; training runs
        on the caller's thread (`_split_cores`).
        """
        from ..engines.transformers.engine import TransformersEngine
        from ..trainer.peft_trainer import add_adapter

        weights, _ = models.load(resolved, config.init_args.dtype, "cpu")
        serving: Any = add_adapter(weights, _SERVING_PLACEHOLDER, config.peft_args, seed=0)
        serving.eval()
        lock = threading.Lock()

        def select_adapter(adapter: str | None) -> contextlib.AbstractContextManager[None]:
            if adapter is None:
                return serving.disable_adapter()  # type: ignore[no-any-return]
            serving.set_adapter(adapter)
            return contextlib.nullcontext()

        return TransformersEngine(
            serving,
            base.tokenizer,
            max_num_seqs=config.engine_args.max_num_seqs,
            model_lock=lock,
            select_adapter=select_adapter,
            stop_token_ids=stop_token_ids,
            serves_training_weights=False,
            merged=self._merged_copy(serving, resolved, config),
            torch_thread=self._torch,
        )

    def _load_base(
        self,
        resolved: models.ResolvedModel,
        config: dev.InternalModelConfig,
        engine_name: EngineName,
    ) -> _Base:
        dedicated = is_cpu_dedicated(config)
        if resolved.weights in self._bases:
            base = self._bases[resolved.weights]
            if base.dedicated != dedicated:
                mode = "dedicated" if base.dedicated else "shared"
                raise ConfigError(
                    "_internal_config.trainer_gpu_ids",
                    f"{resolved.name!r} is already served in {mode} mode in this backend, and "
                    "models of one base share their engine",
                    "Give this model the same trainer_gpu_ids/inference_gpu_ids, or use "
                    "another LocalBackend path",
                )
            if base.engine_name != engine_name:
                raise ConfigError(
                    "_internal_config.engine",
                    f"{resolved.name!r} is already served by the {base.engine_name} engine in "
                    f"this backend, and models of one base share their engine",
                    f"Use engine={base.engine_name!r} for this model too, or another LocalBackend path",
                )
            return base
        model, tokenizer = models.load(resolved, config.init_args.dtype, _training_device(config))
        context = int(getattr(model.config, "max_position_embeddings", 0) or 2048)
        context = min(context, config.engine_args.max_model_len or context)
        base = _Base(
            name=resolved.name,
            model=model,
            tokenizer=tokenizer,
            chat_template=tool_template_for(tokenizer),
            context_length=context,
            lock=threading.Lock(),
            engine_name=engine_name,
            dedicated=dedicated,
        )
        self._bases[resolved.weights] = base
        return base

    def _ensure_server(self) -> str:
        if self._base_url is not None:
            return self._base_url
        import uvicorn

        app = build_app(self, self.api_key)
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name="art-openai-server", daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the OpenAI-compatible server did not start")
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
        groups_json: list[str],
        config: dict[str, Any],
        dev_config: dict[str, Any],
    ) -> dict[str, float]:
        """One training step; the new adapter is saved as the next checkpoint and served."""
        trained = self._models[f"{project}/{name}"]
        groups = [TrajectoryGroup.model_validate_json(text) for text in groups_json]
        train_config = TrainConfig.model_validate(config)
        objective = dev.TrainConfig.model_validate(dev_config)
        # Again here, for callers that reach the service without `model.train` (art serve).
        check_trainable(groups, allow_without_logprobs=objective.allow_training_without_logprobs)
        base = trained.base

        def train_step() -> tuple[dict[str, float], int]:
            base.model.set_adapter(trained.adapter)
            metrics: dict[str, float] = trained.trainer.step(
                groups, train_config, objective, base.chat_template
            )
            step = trained.store.step() + 1
            replace_dir_atomic(trained.store.checkpoint_dir(step), trained.save)
            return metrics, step

        metrics, step = self._exclusive(base, train_step)
        assert base.engine is not None
        if not base.engine.serves_training_weights:
            self._publish(trained, step)  # served before the next rollouts
        return metrics

    def _publish(self, trained: _Trained, step: int) -> None:
        """Load checkpoint `step` into the engine, then make it what `name` routes to."""
        self._checkpoint_adapter(trained, step)
        trained.published = step

    # --- routing ----------------------------------------------------------------------------

    def route(self, model: str) -> Route:
        trained, step_text = self._find(model)
        if trained is None:
            for base in self._bases.values():
                if model == base.name:
                    return self._route(base, None)
            raise KeyError(
                f"unknown model {model!r}; this endpoint serves {', '.join(self.model_names())}"
            )
        step = int(step_text) if step_text.isdigit() else None
        assert trained.base.engine is not None
        if trained.base.engine.serves_training_weights:
            current = trained.store.step()
            if not step_text or step == current:
                return self._route(trained.base, trained.adapter, current)
        elif not step_text:  # an engine with its own weights serves the latest published one
            latest = trained.published if trained.published is not None else trained.store.step()
            step_text, step = "latest", latest
        if step is None or step not in trained.store.checkpoint_steps():
            steps = ", ".join(str(s) for s in trained.store.checkpoint_steps())
            raise KeyError(
                f"model {served_name(trained.project, trained.name)!r} has no checkpoint "
                f"{step_text!r}; it has steps {steps}"
            )
        return self._route(trained.base, self._checkpoint_adapter(trained, step), step)

    def _find(self, model: str) -> tuple[_Trained | None, str]:
        """The trainable model `model` names (`project/name` or a unique `name`), and its step.

        A trained model's full name wins over a base model's hub name of the same spelling.
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

    def _checkpoint_adapter(self, trained: _Trained, step: int) -> str:
        """The adapter serving checkpoint `step`, loaded into the engine if it is not yet."""
        base = trained.base
        assert base.engine is not None
        adapter = f"{trained.adapter}_step{step}"
        evicted: list[str] = []
        with base.checkpoints_lock:
            if adapter in base.checkpoints:
                base.checkpoints.move_to_end(adapter)
                return adapter
            directory = trained.store.checkpoint_dir(step)
            base.engine.load_adapter(adapter, directory)
            base.checkpoints[adapter] = directory
            while len(base.checkpoints) > _SERVED_CHECKPOINTS:
                evicted.append(base.checkpoints.popitem(last=False)[0])
        for oldest in evicted:  # each waits for the requests still sampling with it
            base.engine.unload_adapter(oldest)
        return adapter

    def _route(self, base: _Base, adapter: str | None, step: int | None = None) -> Route:
        assert base.engine is not None
        return Route(
            base.engine, base.tokenizer, base.chat_template, adapter, base.context_length, step
        )

    def base_names(self) -> list[str]:
        """The loaded base models, served under their own names."""
        return [base.name for base in self._bases.values()]

    def longest_context(self) -> int:
        return max((base.context_length for base in self._bases.values()), default=0)

    def model_names(self) -> list[str]:
        names = self.base_names()
        trained = list(self._models.values())
        counts: dict[str, int] = {}
        for model in trained:
            counts[model.name] = counts.get(model.name, 0) + 1
        for model in trained:
            steps = model.store.checkpoint_steps()
            aliases = [served_name(model.project, model.name)]
            if counts[model.name] == 1:
                aliases.append(model.name)
            for alias in aliases:
                names.append(alias)
                names.extend(f"{alias}@{step}" for step in steps)
        return names


def served_name(project: str, name: str) -> str:
    """The name a trainable model is served under, unambiguous across projects."""
    return f"{project}/{name}"


def _adapter_name(model_name: str, index: int) -> str:
    # PEFT keeps adapters in a ModuleDict, whose keys cannot contain '.'.
    return f"m{index}_{re.sub(r'[^A-Za-z0-9_]', '_', model_name)}"


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
