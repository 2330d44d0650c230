"""Run many rollouts concurrently, with a progress bar and an exception budget.

`max_exceptions` is the number of rollouts that may raise before the whole gather
fails: an int is a count, a float in (0, 1) a fraction of all rollouts in the gather.
A rollout that raises within the budget is kept as data in its group's `exceptions`
and counted in the `exception_rate` that `model.log` and `model.train` record. Only
`Exception`s are caught: cancellation and Ctrl-C stop the gather as they should.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload

from tqdm.auto import tqdm

from .data.errors import ConfigError
from .data.rollouts import listening, observed, run_all
from .data.trajectories import (
    PendingTrajectoryGroup,
    PydanticException,
    Trajectory,
    TrajectoryGroup,
)
from .metrics.batch_metrics import completion_tokens

AfterEach = Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup | list[TrajectoryGroup] | None]]
T = TypeVar("T")


@dataclass
class _Progress:
    """Running figures of one gather, shared by all its rollouts.

    The bar shows what `history.jsonl` will record for the groups kept so far (see
    `metrics.py`): the mean reward, mean sampled tokens per trajectory, and the mean of
    each trajectory metric. With `scored` (an `after_each` is given) a trajectory counts
    once its group comes back from `after_each`, so a reward is shown only once one has
    been scored; otherwise it counts when its rollout finishes.
    """

    total: int
    max_exceptions: int | float
    bar: tqdm[Any] | None = None
    scored: bool = False
    exceptions: int = 0
    trajectories: int = 0  # counted in the figures below
    reward_sum: float = 0.0
    completion_tokens: int = 0
    counts_tokens: bool = True
    max_metrics: int | None = None  # trajectory metrics shown (first seen first); None: all
    metric_sums: dict[str, float] = field(default_factory=dict)
    metric_counts: dict[str, int] = field(default_factory=dict)

    def add_trajectory(self, trajectory: Trajectory) -> None:
        """A rollout finished."""
        if not self.scored:
            self._count(trajectory)
        self._refresh(advance=1)

    def add_kept(self, groups: list[TrajectoryGroup]) -> None:
        """`after_each` returned these groups, scored."""
        for group in groups:
            for trajectory in group.trajectories:
                self._count(trajectory)
        self._refresh(advance=0)

    def _count(self, trajectory: Trajectory) -> None:
        self.trajectories += 1
        self.reward_sum += trajectory.reward
        self.completion_tokens += completion_tokens(trajectory)
        for key, value in trajectory.metrics.items():
            if isinstance(value, int | float):  # bools count as 0/1, as in the history
                self.metric_sums[key] = self.metric_sums.get(key, 0.0) + float(value)
                self.metric_counts[key] = self.metric_counts.get(key, 0) + 1

    def add_exception(self, error: BaseException) -> None:
        """Count a failed rollout; re-raise it once the budget is spent."""
        self.exceptions += 1
        self._refresh(advance=1)
        if self.over_budget():
            error.add_note(
                f"art: {self.exceptions} of {self.total} rollouts raised, more than "
                f"max_exceptions={self.max_exceptions} allows; raise max_exceptions to keep "
                "failed rollouts as data instead"
            )
            raise error

    def over_budget(self) -> bool:
        if isinstance(self.max_exceptions, float) and self.max_exceptions < 1:
            return self.exceptions > math.floor(self.max_exceptions * self.total)
        return self.exceptions > self.max_exceptions

    def postfix(self) -> dict[str, Any]:
        """The figures the bar shows, named as in `history.jsonl`."""
        postfix: dict[str, Any] = {}
        if self.trajectories:
            postfix["reward"] = f"{self.reward_sum / self.trajectories:.3f}"
        for key in list(self.metric_sums)[: self.max_metrics]:
            # as in the history row, a trajectory metric never hides a group figure
            postfix.setdefault(key, f"{self.metric_sums[key] / self.metric_counts[key]:.3g}")
        if self.exceptions:
            postfix["exceptions"] = self.exceptions
        if self.counts_tokens and self.completion_tokens:
            postfix["completion_tokens"] = f"{self.completion_tokens / self.trajectories:.1f}"
        return postfix

    def _refresh(self, advance: int) -> None:
        if self.bar is None:
            return
        self.bar.set_postfix(self.postfix(), refresh=False)
        self.bar.update(advance)


def _check_max_exceptions(max_exceptions: int | float) -> None:
    if (
        isinstance(max_exceptions, bool)
        or not isinstance(max_exceptions, int | float)
        or not max_exceptions >= 0
        or (
            isinstance(max_exceptions, float)
            and max_exceptions >= 1
            and not max_exceptions.is_integer()
        )
    ):
        raise ConfigError(
            "max_exceptions",
            f"got {max_exceptions!r}",
            "Pass a count (an int >= 0) or a fraction of all rollouts (a float in (0, 1))",
        )


def _rollout_count(group: object) -> int:
    if isinstance(group, PendingTrajectoryGroup):
        return len(group)
    if isinstance(group, TrajectoryGroup):
        return len(group.trajectories) + len(group.exceptions)
    return 1


async def gather_trajectory_groups(
    groups: Iterable[Awaitable[TrajectoryGroup] | TrajectoryGroup],
    *,
    pbar_desc: str | None = "gather",
    pbar_total_completion_tokens: bool = True,
    max_exceptions: int | float = 0,
    max_metrics: int | None = None,
    after_each: AfterEach | None = None,
) -> list[TrajectoryGroup]:
    """Run every group's rollouts concurrently and return the finished groups in order.

    Args:
        groups: `art.TrajectoryGroup(rollout(...) for _ in range(n))` per scenario.
        pbar_desc: progress bar label; None shows no bar.
        pbar_total_completion_tokens: show the mean sampled tokens per trajectory
            (`completion_tokens` in `history.jsonl`).
        max_exceptions: how many rollouts may raise (an int count, or a float fraction
            of all rollouts) before the gather raises the last one.
        max_metrics: how many of the trajectories' metrics the bar shows (their running
            means, in the order first seen); None shows all, 0 none.
        after_each: awaited with each finished group; returns the group (or a new one,
            or a list of groups) to keep, or None to drop it. Runs while other groups
            are still rolling out, so scoring overlaps generation.

    The bar shows the figures `model.log`/`model.train` will record for the groups
    kept so far: the mean reward, mean sampled tokens and the mean of each trajectory
    metric. With `after_each` they cover only groups it has returned, so no reward is
    shown before the first group is scored.
    """
    _check_max_exceptions(max_exceptions)
    if max_metrics is not None and (
        isinstance(max_metrics, bool) or not isinstance(max_metrics, int) or max_metrics < 0
    ):
        raise ConfigError(
            "max_metrics",
            f"got {max_metrics!r}",
            "Pass how many metrics the progress bar shows (an int >= 0), or None for all",
        )
    pending = list(groups)
    progress = _Progress(
        total=sum(_rollout_count(group) for group in pending),
        max_exceptions=max_exceptions,
        counts_tokens=pbar_total_completion_tokens,
        max_metrics=max_metrics,
        scored=after_each is not None,
    )
    if pbar_desc is not None:
        progress.bar = tqdm(total=progress.total, desc=pbar_desc, unit="rollout")

    async def finish(group: Awaitable[TrajectoryGroup] | TrajectoryGroup) -> list[TrajectoryGroup]:
        if isinstance(group, TrajectoryGroup):
            done = group
            for trajectory in done.trajectories:
                progress.add_trajectory(trajectory)
            for record in done.exceptions:
                progress.add_exception(_RecordedException(record))
        else:
            done = await group
        if after_each is None:
            return [done]
        kept = await after_each(done)
        groups = [] if kept is None else kept if isinstance(kept, list) else [kept]
        progress.add_kept(groups)
        return groups

    try:
        with listening(progress):
            results = await run_all([finish(group) for group in pending])
    except BaseException:
        for group in pending:
            if isinstance(group, PendingTrajectoryGroup):
                group.close()
        raise
    finally:
        if progress.bar is not None:
            progress.bar.close()
    return [group for kept in results for group in kept]


class _RecordedException(Exception):
    """An exception that an already-built group carried in, re-raised by type and message."""

    def __init__(self, record: PydanticException) -> None:
        super().__init__(f"{record.type}: {record.message}")


@overload
async def gather_trajectories(
    trajectories: Iterable[Awaitable[Trajectory]],
    *,
    pbar_desc: str | None = ...,
    pbar_total_completion_tokens: bool = ...,
    max_exceptions: Literal[0] = ...,
) -> list[Trajectory]: ...


@overload
async def gather_trajectories(
    trajectories: Iterable[Awaitable[Trajectory]],
    *,
    pbar_desc: str | None = ...,
    pbar_total_completion_tokens: bool = ...,
    max_exceptions: int | float,
) -> list[Trajectory | BaseException]: ...


async def gather_trajectories(
    trajectories: Iterable[Awaitable[Trajectory]],
    *,
    pbar_desc: str | None = "gather",
    pbar_total_completion_tokens: bool = True,
    max_exceptions: int | float = 0,
) -> list[Trajectory] | list[Trajectory | BaseException]:
    """Run rollouts concurrently; failures within `max_exceptions` stay in place as exceptions."""
    _check_max_exceptions(max_exceptions)
    rollouts = list(trajectories)
    progress = _Progress(
        total=len(rollouts),
        max_exceptions=max_exceptions,
        counts_tokens=pbar_total_completion_tokens,
    )
    if pbar_desc is not None:
        progress.bar = tqdm(total=progress.total, desc=pbar_desc, unit="rollout")

    async def run_one(rollout: Awaitable[Trajectory]) -> Trajectory | BaseException:
        try:
            result = await observed(rollout)
        except Exception as error:
            progress.add_exception(error)
            return error
        progress.add_trajectory(result)
        return result

    try:
        return await run_all([run_one(rollout) for rollout in rollouts])
    finally:
        if progress.bar is not None:
            progress.bar.close()


__all__ = ["AfterEach", "completion_tokens", "gather_trajectories", "gather_trajectory_groups"]
