"""Loaded base models and the trainable models on them.

Models that share a base model share its weights: each trainable model gets its own LoRA
adapter in one PEFT model (the training model). A `LoadedBase` owns that model, the
engine that serves it and the checkpoints loaded into that engine; `train_lock`
serializes every change of the training model (an adapter added or removed, a step),
and `on_training_model` is the one way to make such a change.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ...core.data import dev
from ...core.store.model_store import ModelStore
from ...core.store.writer_lock import WriterLock
from ..chat_format import ChatRendering
from ..engines.base import Engine
from ..torch_thread import TorchThread
from .checkpoints import CheckpointCache
from .placement import Trainer

T = TypeVar("T")


@dataclass
class LoadedBase:
    """One loaded base model and everything that shares its weights."""

    name: str  # as the user named it; the endpoint serves the base under it
    model: Any  # the training model: a PeftModel once the first adapter exists
    tokenizer: Any
    rendering: ChatRendering
    context_length: int
    config: dev.InternalModelConfig  # the config it was loaded with (engine, mode, dtype)
    train_lock: threading.Lock
    checkpoints: CheckpointCache
    engine: Engine | None = None  # started once its first model has an adapter


@dataclass
class TrainedModel:
    """A registered trainable model."""

    project: str
    name: str  # the alias it is served under (`project/name`, `name@step`)
    run_name: str  # its durable name: its store, its key in the service (ART 0.5.23's)
    base: LoadedBase
    adapter: str  # its adapter's name in the training model
    store: ModelStore
    trainer: Trainer
    base_model: str  # as the user named it
    config: dev.InternalModelConfig
    trained_step: int  # the checkpoint step its adapter holds now
    published: int | None = None  # the newest step loaded into an engine with its own weights
    writer_lock: WriterLock | None = None  # held from its first step here until unloaded
    # The adapter changed since its latest checkpoint (Tinker's optim_step and load_state
    # change it without saving): the latest step is then served from its files.
    unsaved: bool = False

    def save(self, directory: Path) -> None:
        """Write the adapter and optimizer state, naming the base as the user did."""
        import json

        self.trainer.save(directory)
        # Not our cache path: the checkpoint then loads as a `base_model` wherever that
        # name resolves.
        config_path = directory / "adapter_config.json"
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = self.base_model
        config_path.write_text(json.dumps(config, indent=2))


def on_training_model(base: LoadedBase, work: Callable[[], T], torch_thread: TorchThread) -> T:
    """`work()` with sole use of `base`'s training model.

    Takes `base.train_lock`, then what the engine must stop for (`Engine.training()`).
    The work runs on the torch thread, except where the engine serves while a step
    trains (dedicated mode): the torch thread decodes then, and the work runs on the
    caller's thread, on cores of its own.
    """

    def held() -> T:
        with base.engine.training() if base.engine is not None else contextlib.nullcontext():
            return work()

    with base.train_lock:
        if base.engine is not None and base.engine.serves_while_training:
            return held()
        return torch_thread.run(held)


def run_name_of(record: dict[str, Any]) -> str:
    """A registration's durable name: its `run_name`, else its `name`."""
    return str(record.get("run_name") or record["name"])


def adapter_name(model_name: str, index: int) -> str:
    """A PEFT adapter name for a model: unique in the process, and without '.' (PEFT keeps
    adapters in a ModuleDict, whose keys cannot contain one)."""
    import re

    return f"m{index}_{re.sub(r'[^A-Za-z0-9_]', '_', model_name)}"


__all__ = [
    "LoadedBase",
    "TrainedModel",
    "adapter_name",
    "on_training_model",
    "run_name_of",
]
