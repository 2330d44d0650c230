"""Where a model with no backend logs: ART's frontend logging under `Model.base_path`.

ART's `Model.log` writes on the client whether or not a backend is registered, so an
API model (`art.Model(name="gpt-4.1", ...)`) can be evaluated and compared without one.
Ours writes through the backend where there is one; an unregistered model's `log` comes
here and writes the same files a `LocalBackend(path=base_path)` would:
`<base_path>/<project>/models/<name>/history.jsonl` and
`trajectories/<split>/<step:04d>.parquet`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .store.model_store import ModelStore
from .store.run_paths import StoredModel

if TYPE_CHECKING:
    from .data.trajectories import TrajectoryGroup


class StoreLog:
    """The `log` half of a backend, writing straight to the model store under `path`."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def log(
        self,
        model: StoredModel,
        groups: list[TrajectoryGroup],
        *,
        split: str,
        step: int,
        metrics: dict[str, float],
    ) -> None:
        store = ModelStore(self.path, model.project, model.storage_name)
        await asyncio.to_thread(store.write_log, split, step, groups, metrics)


__all__ = ["StoreLog"]
