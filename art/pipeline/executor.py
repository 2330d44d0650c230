"""How PipelineTrainer launches each rollout: ART 0.5.23's `RolloutExecutor` contract.

The trainer tells the executor how many workers it wants (`set_target`, at the start and
whenever the tuner moves the count) and which worker ids are live (`set_workers`), and
runs every rollout through `run(worker_id, rollout_fn, model, scenario, config)`, which
returns the rollout's `TrajectoryGroup`. An executor with a fixed capacity says so in
`max_workers`: more workers than that are refused, or capped where the count was not
asked for by hand (ART's rule). `LocalRolloutExecutor`, the default, awaits the rollout in
this process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from ..core.data.errors import ConfigError

_CAPACITY_DEFAULTS = {"trajectory_capacity_records": 16_384, "trajectory_capacity_bytes": 4 << 30}


@runtime_checkable
class RolloutExecutor(Protocol):
    """What `PipelineTrainer(rollout_executor=...)` takes (ART's protocol)."""

    @property
    def max_workers(self) -> int | None:
        """The most rollout workers it can run at once; None: no limit."""
        ...

    def set_target(self, target_workers: int) -> None:
        """The trainer now wants `target_workers` workers."""
        ...

    def set_workers(self, worker_ids: tuple[int, ...]) -> None:
        """The ids of the workers now running."""
        ...

    async def run(
        self,
        worker_id: int,
        rollout_fn: Callable[..., Awaitable[Any]],
        model: Any,
        scenario: Any,
        config: Any,
    ) -> Any:
        """Run one rollout for worker `worker_id`; return its `TrajectoryGroup`."""
        ...


class LocalRolloutExecutor:
    """Runs each rollout as a coroutine of the trainer's own event loop (no limit).

    ART's takes the capacity of its in-process trajectory store; here finished groups
    wait in the trainer's queue (bounded by `queue_maxsize`), so only its defaults are taken.
    """

    max_workers: int | None = None

    def __init__(
        self,
        *,
        trajectory_capacity_records: int = 16_384,
        trajectory_capacity_bytes: int = 4 << 30,
    ) -> None:
        given = {
            "trajectory_capacity_records": trajectory_capacity_records,
            "trajectory_capacity_bytes": trajectory_capacity_bytes,
        }
        for name, value in given.items():
            if value != _CAPACITY_DEFAULTS[name]:
                raise ConfigError(
                    name,
                    f"is {value}; finished groups wait in PipelineTrainer's queue here, "
                    "not in a separate trajectory store",
                    "Leave it at its default and bound the queue with "
                    "PipelineRuntimeConfig(queue_maxsize=...)",
                )

    def set_target(self, target_workers: int) -> None:
        if target_workers < 1:
            raise ConfigError("target_workers", f"is {target_workers}", "Use 1 or more")

    def set_workers(self, worker_ids: tuple[int, ...]) -> None:
        del worker_ids  # every worker is a coroutine here: nothing to place

    async def run(
        self,
        worker_id: int,
        rollout_fn: Callable[..., Awaitable[Any]],
        model: Any,
        scenario: Any,
        config: Any,
    ) -> Any:
        del worker_id
        return await rollout_fn(model, scenario, config)


def check_executor(executor: object) -> RolloutExecutor:
    """`executor` if it has the protocol's four members, else a ConfigError naming it."""
    missing = [
        name
        for name in ("max_workers", "set_target", "set_workers", "run")
        if not hasattr(executor, name)
    ]
    if missing:
        raise ConfigError(
            "rollout_executor",
            f"is a {type(executor).__name__}, without {', '.join(missing)}",
            "Pass an object with max_workers, set_target, set_workers and async run "
            "(art.pipeline.executor.RolloutExecutor), or leave it None",
        )
    capacity = executor.max_workers  # type: ignore[attr-defined]
    if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
        raise ConfigError(
            "rollout_executor", f"says max_workers={capacity!r}", "Use None or 1 or more"
        )
    return executor  # type: ignore[return-value]


__all__ = ["LocalRolloutExecutor", "RolloutExecutor", "check_executor"]
