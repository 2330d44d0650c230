"""Capture scopes: `with art.Trajectory() as t:` records the model calls made inside it.

The open scopes form a stack per context (`art.core.data.scope_stack`, which the data model
opens and closes): each asyncio task and each thread run in a copied context sees the
scopes it was started in. The innermost scope's trajectory receives the exchanges recorded
by clients that carry a capture hook (`art.capture_http_client()`,
`art.capture_sync_http_client()`, `art.capture_trace_config()`,
`art.capture_requests_session()`, `model.openai_client()`): see
`art.core.capture.exchange_capture`. `no_capture()` hides every enclosing scope; a scope entered
inside it captures again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Iterable, Mapping
from typing import Any, Literal, cast, overload

from ..data.errors import ArtValueError
from ..data.scope_stack import CaptureScopeError, enter, exit, innermost, no_capture
from ..data.trajectories import PydanticException, Trajectory, TrajectoryGroup
from ..data.types import MetadataValue, MetricValue


class CoroutineRequiredError(ArtValueError, TypeError):
    """`art.trajectory` was given something other than a raw coroutine (a TypeError, as ART's)."""


@overload
def current_trajectory(*, require: Literal[True]) -> Trajectory: ...


@overload
def current_trajectory(*, require: bool = False) -> Trajectory | None: ...


def current_trajectory(*, require: bool = False) -> Trajectory | None:
    """The trajectory of the innermost open capture scope, if any.

    With `require=True`, outside every scope (or inside `no_capture()`) raises.
    """
    scope = innermost()
    if scope is not None:
        return cast(Trajectory, scope)
    if require:
        raise CaptureScopeError(
            "no trajectory is being captured here. Run this code inside "
            "`with art.Trajectory() as t:` or `await art.trajectory(rollout(...))`"
        )
    return None


async def trajectory(coroutine: Coroutine[Any, Any, object]) -> Trajectory:
    """Run `coroutine` inside a new capture scope and return its trajectory.

    Pass the call itself (`art.trajectory(rollout(scenario))`): a Task or Future already
    runs in the context it was made in, outside the scope.
    """
    if isinstance(coroutine, asyncio.Future) or not isinstance(coroutine, Coroutine):
        raise CoroutineRequiredError(
            "coroutine",
            f"expected a raw coroutine, got {type(coroutine).__name__}",
            "Pass the call, not a Task, Future or other awaitable: "
            "`art.trajectory(rollout(scenario))`",
        )
    with Trajectory() as captured:
        await coroutine
    return captured


async def trajectory_group(
    trajectories: Iterable[Trajectory | BaseException | Awaitable[Trajectory]],
    *,
    exceptions: Iterable[BaseException | PydanticException] = (),
    metadata: Mapping[str, MetadataValue] | None = None,
    metrics: Mapping[str, MetricValue] | None = None,
    logs: Iterable[str] | None = None,
    return_exceptions: bool = False,
) -> TrajectoryGroup:
    """A group of trajectories, running the awaitables among them concurrently.

    Trajectories and exceptions are kept as given; each awaitable (the same one given
    twice runs once) runs outside every enclosing capture scope, so each rollout captures
    only into the scopes it opens itself (`art.trajectory(rollout(...))`). The group
    keeps the order given. A rollout that raises an Exception fails the group, the other
    rollouts cancelled, unless `return_exceptions=True` records it in `exceptions`; a
    BaseException that is not an Exception (a cancellation) always propagates.
    """
    with no_capture():
        given = list(exceptions)
        for error in given:
            if isinstance(error, BaseException) and not isinstance(error, Exception):
                raise error
        results: list[Trajectory | BaseException | None] = []
        pending: dict[asyncio.Future[Trajectory], list[int]] = {}
        by_identity: dict[int, asyncio.Future[Trajectory]] = {}
        try:
            for item in trajectories:
                if isinstance(item, Trajectory | BaseException):
                    if isinstance(item, BaseException) and not isinstance(item, Exception):
                        raise item
                    results.append(item)
                    continue
                task = by_identity.get(id(item))
                if task is None:
                    task = by_identity[id(item)] = asyncio.ensure_future(item)
                    pending[task] = []
                pending[task].append(len(results))
                results.append(None)
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    indexes = pending.pop(task)
                    outcome = _outcome(task, return_exceptions)
                    for index in indexes:
                        results[index] = outcome
        except BaseException:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            raise
    return TrajectoryGroup(
        [result for result in results if result is not None],
        exceptions=given,
        metadata=metadata,
        metrics=metrics,
        logs=logs,
    )


def _outcome(task: asyncio.Future[Trajectory], return_exceptions: bool) -> Trajectory | Exception:
    try:
        result = task.result()
    except Exception as error:  # a BaseException (a cancellation) propagates
        if not return_exceptions:
            raise
        return error
    if not isinstance(result, Trajectory):
        raise ArtValueError(
            "trajectories",
            f"an awaitable resolved to {type(result).__name__}, not a Trajectory",
            "Make each rollout return an `art.Trajectory` (or wrap it: "
            "`art.trajectory(rollout(...))`)",
        )
    return result


__all__ = [
    "CaptureScopeError",
    "CoroutineRequiredError",
    "current_trajectory",
    "enter",
    "exit",
    "no_capture",
    "trajectory",
    "trajectory_group",
]
