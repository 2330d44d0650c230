"""`LocalBackend`: models stored (and, once serving lands, served and trained) on this machine."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ...core import dev
from ...core.backend import InferenceEndpoint
from ...core.errors import ConfigError, NotBuiltError
from ...core.model import Model, TrainableModel
from ...core.storage import ModelStore
from ...core.trajectories import TrajectoryGroup
from ...core.types import TrainConfig


class LocalBackend:
    """Runs the model service on this machine and keeps every run under `path`.

    Args:
        in_process: run the model service inside this process (True) or in a child
            process that exits with this one (False).
        path: where models, checkpoints and trajectory logs are stored.
    """

    def __init__(
        self, *, in_process: bool = False, path: str | os.PathLike[str] = "./.art"
    ) -> None:
        self.in_process = in_process
        self.path = os.fspath(path)
        self._locks: dict[str, asyncio.Lock] = {}

    def __repr__(self) -> str:
        return f"LocalBackend(path={self.path!r}, in_process={self.in_process})"

    def _store(self, model: Model) -> ModelStore:
        return ModelStore(self.path, model.project, model.name)

    def _lock(self, model: Model) -> asyncio.Lock:
        # One writer per model at a time: two concurrent `log` calls must not both
        # read-modify-write the same Parquet file or history.
        return self._locks.setdefault(f"{model.project}/{model.name}", asyncio.Lock())

    async def register(self, model: Model) -> InferenceEndpoint | None:
        store = self._store(model)
        record: dict[str, Any] = {
            "name": model.name,
            "project": model.project,
            "trainable": model.trainable,
            "config": model.config,
        }
        if isinstance(model, TrainableModel):
            record["base_model"] = model.base_model
            record["internal_config"] = model.internal_config.model_dump(mode="json")
        existing = store.read_model()
        if existing is not None and existing.get("base_model") != record.get("base_model"):
            raise ConfigError(
                "base_model",
                f"model {model.name!r} in {store.dir} was trained from "
                f"{existing.get('base_model')!r}, not {record.get('base_model')!r}",
                "Give the new run its own name, or keep the original base_model",
            )
        async with self._lock(model):
            await asyncio.to_thread(store.write_model, record)
        return None

    async def get_step(self, model: Model) -> int:
        return await asyncio.to_thread(self._store(model).step)

    async def log(
        self,
        model: Model,
        groups: list[TrajectoryGroup],
        *,
        split: str,
        step: int,
        metrics: dict[str, float],
    ) -> None:
        store = self._store(model)
        async with self._lock(model):
            if groups:
                await asyncio.to_thread(store.write_trajectories, split, step, groups)
            await asyncio.to_thread(store.append_history, step, metrics)

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        *,
        config: TrainConfig,
        dev_config: dev.TrainConfig,
        verbose: bool,
    ) -> None:
        raise NotBuiltError(
            "LocalBackend training",
            "this version stores and logs trajectories but has no trainer yet; "
            "log them with `await model.log(groups, split='train')` meanwhile",
        )

    async def delete_checkpoints(self, model: Model, *, best_checkpoint_metric: str) -> list[int]:
        store = self._store(model)
        async with self._lock(model):
            return await asyncio.to_thread(
                store.delete_checkpoints_but_best, best_checkpoint_metric
            )

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> LocalBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
