"""The mean reward of a model's rollouts: a quick benchmark before (or without) training."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from ..core.data.errors import ConfigError
from ..core.data.trajectories import Trajectory, TrajectoryGroup
from ..core.gather import gather_trajectory_groups


async def benchmark_rollout(
    model: str,
    num_rollouts: int,
    rollout: Callable[[str, int, bool], Coroutine[Any, Any, Trajectory]],
) -> float:
    """Run `rollout(model, i, False)` for i in 0..num_rollouts-1 concurrently (one group,
    with a progress bar), print and return their mean reward.

    The third argument tells the rollout it is not training. A rollout that raises fails
    the benchmark (no exception budget), so a mean is never taken over the survivors.
    """
    if num_rollouts < 1:
        raise ConfigError("num_rollouts", f"{num_rollouts} rollouts have no mean", "Pass 1 or more")
    groups = await gather_trajectory_groups(
        [TrajectoryGroup(rollout(model, i, False) for i in range(num_rollouts))],
        pbar_desc="Benchmarking rollout",
    )
    rewards = [trajectory.reward for group in groups for trajectory in group.trajectories]
    average = sum(rewards) / len(rewards)
    print(f"Average reward for {model}: {average}")
    return average


__all__ = ["benchmark_rollout"]
