"""A backend that is not one of ours, driven by ART's backend protocol.

Integrations outside this project implement ART's private backend methods (ART 0.5.17,
read from its wheel: `art/backend.py`, `art/model.py`), often over HTTP to `art run`:

    register(model)                                   store (and load) the model
    _prepare_backend_for_training(model, config)      -> (base_url, api_key) to sample from
    _model_inference_name(model, step=None)           the `model` name to send (optional)
    _get_step(model)                                  -> the model's current step
    _train_model(model, groups, config, dev_config, verbose)   an async stream of metric dicts
    _train_sft(model, trajectories, config, dev_config, verbose)  the same, for SFT (optional)
    _delete_checkpoint_files(model, steps_to_keep)
    close()

`ProtocolBackend` turns such an object into our `Backend`, so `TrainableModel` drives it
the way ART's own `TrainableModel` does: the training step's groups and metrics are logged
on the client (under `path`, ART's `base_path`, default `./.art`), as ART 0.5.17 does.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, Protocol

from .backend import InferenceEndpoint
from .data import dev
from .data.errors import ConfigError
from .data.trajectories import Trajectory, TrajectoryGroup
from .data.types import TrainConfig, TrainResult, TrainSFTConfig
from .store.model_store import ModelStore
from .training import TrainedModel, run_step


class DrivenModel(TrainedModel, Protocol):
    """What this wrapper reads of a model (`art.Model` and `TrainableModel` are ones);
    the driven backend gets the model itself."""

    @property
    def project(self) -> str: ...

    @property
    def storage_name(self) -> str: ...

    @property
    def trainable(self) -> bool: ...

    @property
    def inference_model_name(self) -> str | None: ...


REQUIRED = ("register", "_get_step", "_delete_checkpoint_files", "close")
REQUIRED_TO_TRAIN = ("_prepare_backend_for_training", "_train_model")


class ProtocolBackend:
    """Drives `driven`, an object with ART's backend methods, as our `Backend`.

    Checked once, when `model` registers: a missing method is a `ConfigError` naming it.
    `server_config` is the model's `_openai_client_config`, given to
    `_prepare_backend_for_training` as ART gives it.
    """

    def __init__(
        self, driven: object, model: DrivenModel, server_config: Any = None, *, path: str = "./.art"
    ) -> None:
        needed = REQUIRED + (REQUIRED_TO_TRAIN if model.trainable else ())
        missing = [name for name in needed if not callable(getattr(driven, name, None))]
        if missing:
            raise ConfigError(
                "backend",
                f"{type(driven).__name__} is not an art backend and lacks ART's backend "
                f"method{'s' if len(missing) > 1 else ''} {', '.join(missing)}",
                "Pass a LocalBackend, ServerlessBackend or SkyPilotBackend, or an object "
                "implementing ART's Backend protocol (art.backend.Backend)",
            )
        self.driven: Any = driven
        self.path = path
        self._server_config = server_config

    def __repr__(self) -> str:
        return f"ProtocolBackend({self.driven!r})"

    def _store(self, model: DrivenModel) -> ModelStore:
        return ModelStore(self.path, model.project, model.storage_name)

    def inference_name(self, model: DrivenModel, step: int | None) -> str:
        """The backend's `_model_inference_name`, or ART's fallback: `name`, `name@step`."""
        name_for = getattr(self.driven, "_model_inference_name", None)
        if callable(name_for):
            return str(name_for(model, step=step))
        base = model.inference_model_name or model.name
        return base if step is None else f"{base}@{step}"

    async def register(self, model: DrivenModel) -> InferenceEndpoint | None:
        await self.driven.register(model)
        if not model.trainable:
            return None
        base_url, api_key = await self.driven._prepare_backend_for_training(
            model, self._server_config
        )
        return InferenceEndpoint(
            base_url=base_url, api_key=api_key, model_name=self.inference_name(model, None)
        )

    async def get_step(self, model: DrivenModel) -> int:
        return int(await self.driven._get_step(model))

    async def log(
        self,
        model: DrivenModel,
        groups: list[TrajectoryGroup],
        *,
        split: str,
        step: int,
        metrics: dict[str, float],
    ) -> None:
        store = self._store(model)
        await asyncio.to_thread(store.write_log, split, step, groups, metrics)

    async def train(
        self, model: DrivenModel, trajectory_groups: Iterable[TrajectoryGroup]
    ) -> TrainResult:
        """One step, nothing logged (ART 0.5.18's `backend.train`, with its defaults)."""
        result = await run_step(model, trajectory_groups, log=False, backend=self)
        return TrainResult(step=await self.get_step(model), metrics=result.metrics)

    async def train_step(
        self,
        model: DrivenModel,
        groups: list[TrajectoryGroup],
        *,
        config: TrainConfig,
        dev_config: dev.TrainConfig,
        verbose: bool,
    ) -> dict[str, float]:
        # ART's own dev config is a dict: the fields set, as its client would send them.
        sent = dev_config.model_dump(mode="json", exclude_unset=True)
        stream = self.driven._train_model(model, groups, config, sent, verbose)
        return _mean(await _collect(stream))

    async def train_sft(
        self,
        model: DrivenModel,
        examples: Iterator[tuple[str, Trajectory]],
        *,
        config: TrainSFTConfig,
        dev_config: dev.TrainSFTConfig,
        verbose: bool,
    ) -> list[dict[str, float]]:
        train_sft = getattr(self.driven, "_train_sft", None)
        if not callable(train_sft):
            raise ConfigError(
                "backend",
                f"{type(self.driven).__name__} has no _train_sft, so it cannot run SFT",
                "Use a backend that implements ART's _train_sft, or LocalBackend",
            )
        trajectories = [trajectory for _, trajectory in examples]
        sent = dev_config.model_dump(mode="json", exclude_unset=True)
        return await _collect(train_sft(model, trajectories, config, sent, verbose))

    async def delete_checkpoints(self, model: DrivenModel, *, best_checkpoint_metric: str) -> None:
        """Keep the latest step and the best on the client's history (as ART's model
        does); the backend deletes the rest and does not say which."""
        keep = [await self.get_step(model)]
        store = self._store(model)
        if not store.history_path.exists():
            print(f'"{store.history_path}" not found')
        elif means := await asyncio.to_thread(store.metric_by_step, best_checkpoint_metric):
            keep.append(max(means, key=lambda step: (means[step], step)))
        else:
            print(f'No "{best_checkpoint_metric}" metric found in history')
        await self.driven._delete_checkpoint_files(model, keep)

    async def close(self) -> None:
        closed = self.driven.close()
        if inspect.isawaitable(closed):
            await closed


async def _collect(stream: AsyncIterator[dict[str, float]]) -> list[dict[str, float]]:
    return [dict(metrics) async for metrics in stream]


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each numeric metric averaged over the rows that have it (ART averages them too)."""
    values: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                values.setdefault(key, []).append(float(value))
    return {key: sum(v) / len(v) for key, v in values.items()}


__all__ = ["DrivenModel", "ProtocolBackend"]
