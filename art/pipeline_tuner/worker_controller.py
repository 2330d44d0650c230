"""Grows and shrinks the running rollout workers to a target count, as ART's does.

New workers start at once; surplus ones retire: a retiring worker finishes the rollout it
has started and then takes no new scenario (it asks `worker_allowed` before each one).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class RolloutHost(Protocol):
    """What the controller runs workers for (`PipelineTrainer` is one)."""

    @property
    def stop_requested(self) -> asyncio.Event:
        """Set once the run is to stop: the controller then ends its workers."""
        ...

    async def run_rollout_worker(self, worker_id: int) -> None:
        """A worker: returns when the scenarios run out, the run stops, or
        `worker_allowed(worker_id)` turns False."""
        ...

    def rollout_worker_ended(self, task: asyncio.Task[None]) -> None:
        """Told of every finished worker."""
        ...


class RolloutWorkerController:
    """Keeps `target_workers` rollout workers of `trainer` (a `RolloutHost`) running
    until the run ends; a trainer with a `rollout_executor` (PipelineTrainer's) has it
    told the live worker ids after every change."""

    def __init__(self, trainer: RolloutHost, target_workers: int) -> None:
        self.trainer = trainer
        self.target_workers = max(1, int(target_workers))
        self.started_workers = 0  # every worker ever started, so ids are never reused
        self.peak_workers = 0  # the most workers running at once
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._retiring: set[int] = set()
        self._exhausted = False  # a worker ended on its own: the scenarios ran out
        self._changed = asyncio.Event()

    @property
    def live_workers(self) -> int:
        """Workers running now, retiring ones included."""
        return sum(not task.done() for task in self._tasks.values())

    def set_target(self, target_workers: int) -> None:
        """Run `target_workers` (at least 1) from now on."""
        self.target_workers = max(1, int(target_workers))
        self._changed.set()

    def worker_allowed(self, worker_id: int) -> bool:
        """Whether worker `worker_id` may start another rollout."""
        return worker_id not in self._retiring

    async def run(self) -> None:
        """Reconcile until the run stops or every worker ended with the scenarios."""
        try:
            while not self.trainer.stop_requested.is_set():
                self._reap()
                if self._exhausted and not self._tasks:
                    return
                self._reconcile()
                self._changed.clear()
                waits: list[asyncio.Future[Any]] = [
                    asyncio.ensure_future(self._changed.wait()),
                    asyncio.ensure_future(self.trainer.stop_requested.wait()),
                    *(asyncio.shield(task) for task in self._tasks.values()),
                ]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for wait in waits:
                        wait.cancel()
        finally:
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def _reap(self) -> None:
        for worker_id, task in list(self._tasks.items()):
            if not task.done():
                continue
            del self._tasks[worker_id]
            if worker_id not in self._retiring and not task.cancelled():
                self._exhausted = True  # it returned on its own: no scenario left for it
            self._retiring.discard(worker_id)

    def _reconcile(self) -> None:
        live = [wid for wid, task in self._tasks.items() if not task.done()]
        active = [wid for wid in live if wid not in self._retiring]
        self._retiring.update(active[self.target_workers :])
        active = active[: self.target_workers]
        while len(active) < self.target_workers and not self._exhausted:
            worker_id = self.started_workers
            self.started_workers += 1
            task = asyncio.create_task(
                self.trainer.run_rollout_worker(worker_id), name=f"art-rollout-{worker_id}"
            )
            task.add_done_callback(self.trainer.rollout_worker_ended)
            self._tasks[worker_id] = task
            active.append(worker_id)
        self.peak_workers = max(self.peak_workers, len(active))
        executor = getattr(self.trainer, "rollout_executor", None)  # PipelineTrainer's
        if executor is not None:  # retiring workers stay listed until their rollout ends
            executor.set_workers(tuple(self._tasks))


__all__ = ["RolloutWorkerController"]
