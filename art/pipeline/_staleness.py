"""Which policy step sampled a rollout, and whether a group is still fresh enough to train.

A group trains at step `train_step` (the checkpoint its gradient is applied to) only while
`train_step - sampled_step <= max_steps_off_policy`, where `sampled_step` is the oldest
step that sampled any of its turns. The importance ratio against the sampler's logprobs
(in the loss) corrects for the policy having moved since; the bound keeps that ratio near
1, where its correction is sound (as in AReaL's and prime-rl's asynchronous trainers).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..core.exchange_histories import policy_versions
from ..core.trajectories import Trajectory, TrajectoryGroup


def choice_versions(trajectory: Trajectory) -> list[int]:
    """The `policy_version` of every sampled turn, as the endpoint reported it."""
    if trajectory.exchanges:
        return policy_versions(trajectory)
    items: Iterator[Any] = iter(trajectory.messages_and_choices)
    histories = (h.messages_and_choices for h in trajectory.additional_histories)
    versions = []
    for item in [*items, *(i for h in histories for i in h)]:
        if isinstance(item, dict):
            continue  # a plain message: context, not sampled
        version = getattr(item, "policy_version", None)
        if isinstance(version, int):
            versions.append(version)
    return versions


def stamp_versions(group: TrajectoryGroup, *, started_at: int, finished_at: int) -> None:
    """Fill each trajectory's `initial_`/`final_policy_version` where the rollout left them.

    The endpoint's own record (each choice's `policy_version`) wins; a rollout whose turns
    carry none is stamped with the trainer's step when it started and finished.
    """
    for trajectory in group.trajectories:
        versions = choice_versions(trajectory)
        if trajectory.initial_policy_version is None:
            trajectory.initial_policy_version = min(versions, default=started_at)
        if trajectory.final_policy_version is None:
            trajectory.final_policy_version = max(versions, default=finished_at)


def sampled_step(group: TrajectoryGroup) -> int | None:
    """The oldest step that sampled any trajectory of `group` (None: none is stamped)."""
    versions = [
        t.initial_policy_version for t in group.trajectories if t.initial_policy_version is not None
    ]
    return min(versions, default=None)


def is_stale(group: TrajectoryGroup, train_step: int, max_steps_off_policy: int | None) -> bool:
    if max_steps_off_policy is None:
        return False
    sampled = sampled_step(group)
    return sampled is not None and train_step - sampled > max_steps_off_policy


def has_no_variance(group: TrajectoryGroup) -> bool:
    """All rewards equal (or fewer than two rollouts): GRPO's advantages are all zero."""
    rewards = [t.reward for t in group.trajectories]
    return len(rewards) < 2 or max(rewards) - min(rewards) <= 1e-12


def staleness_metrics(groups: Iterable[TrajectoryGroup], train_step: int) -> dict[str, float]:
    """`staleness_mean`/`staleness_max`: steps between sampling and training, per trajectory."""
    ages = [
        train_step - t.initial_policy_version
        for group in groups
        for t in group.trajectories
        if t.initial_policy_version is not None
    ]
    if not ages:
        return {}
    return {"staleness_mean": sum(ages) / len(ages), "staleness_max": float(max(ages))}


__all__ = [
    "choice_versions",
    "has_no_variance",
    "is_stale",
    "sampled_step",
    "staleness_metrics",
    "stamp_versions",
]
