"""Running rollouts concurrently: the first error cancels the rest, each rollout runs
inside its own trace (where a tracing service is on), and a listener (a gather's progress
bar and exception budget) is told of each one that ends.

The data model's `PendingTrajectoryGroup` and `art.gather_*` both run rollouts through
this; a gather makes itself the listener of the rollouts it awaits (`listening`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

from . import observe

T = TypeVar("T")


class RolloutListener(Protocol):
    """Told of each rollout that ends inside a gather."""

    def add_trajectory(self, trajectory: Any) -> None:
        """A rollout returned its trajectory."""
        ...

    def add_exception(self, error: Exception) -> None:
        """A rollout raised `error` (an Exception: cancellations propagate)."""
        ...


_listener: ContextVar[RolloutListener | None] = ContextVar("art_rollout_listener", default=None)


@contextmanager
def listening(listener: RolloutListener) -> Iterator[None]:
    """Tell `listener` of the rollouts that pending groups run inside this block."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


def listener() -> RolloutListener | None:
    """The listener of the rollouts run here, if a gather is running them."""
    return _listener.get()


async def run_all(coroutines: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Run coroutines concurrently in order; on the first error cancel the rest and re-raise it.

    Unlike `asyncio.TaskGroup`, the caller gets the original exception, not an
    ExceptionGroup, which is what rollout code written for ART expects.
    """
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def observed(rollout: Awaitable[T]) -> T:
    """Await one rollout inside its own trace, where a tracing service is on."""
    # A coroutine is named after its function (`rollout`); other awaitables are not.
    with observe.rollout_scope(getattr(rollout, "__name__", "rollout")) as trace:
        try:
            result = await rollout
        except BaseException as error:
            if trace is not None:
                trace.finish(error)
            raise
        if trace is not None:
            trace.finish(result)
        return result


__all__ = ["RolloutListener", "listener", "listening", "observed", "run_all"]
