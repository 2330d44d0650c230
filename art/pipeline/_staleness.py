"""Which policy step sampled a rollout, and whether a group is still fresh enough to train.

A group trains at step `train_step` (the checkpoint its gradient is applied to) only while
`train_step - sampled_step <= max_steps_off_policy`, where `sampled_step` is the oldest
step that sampled any of its turns. The importance ratio against the sampler's logprobs
(in the loss) corrects for the policy having moved since; the bound keeps that ratio near
1, where its correction is sound (as in AReaL's and prime-rl's asynchronous trainers).

ART 0.5.23's `limit_mean_steps_off_policy` bounds a group's *mean* age instead: each
sampled token is `train_step - version` steps old (the version of the turn that sampled
it), and a group whose token-weighted mean age exceeds the limit is dropped as stale, even
where its oldest turn is within `max_steps_off_policy`. A trajectory with no versioned turn
counts at its `initial_policy_version`, weighted by its sampled tokens (at least 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..core.data.exchange_histories import policy_versions
from ..core.data.exchanges import sampled_tokens
from ..core.data.trajectories import Trajectory, TrajectoryGroup
from ..core.metrics.batch_metrics import completion_tokens


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


def turn_ages(trajectory: Trajectory, train_step: int) -> list[tuple[int, int]]:
    """(age in steps, sampled tokens) of each versioned turn of `trajectory`."""
    turns: list[tuple[int, int]] = []
    for exchange in trajectory.exchanges.all():
        for tokens in sampled_tokens(exchange):
            if tokens.policy_version is not None:
                turns.append((train_step - tokens.policy_version, len(tokens.token_ids)))
    histories = [trajectory.messages_and_choices] + [
        h.messages_and_choices for h in trajectory.additional_histories
    ]
    if trajectory.exchanges:  # the exchanges hold every turn (as `choice_versions`)
        histories = []
    for items in histories:
        for item in items:
            version = None if isinstance(item, dict) else getattr(item, "policy_version", None)
            if isinstance(version, int):
                extra = getattr(item, "model_extra", None) or {}
                ids = extra.get("token_ids")
                turns.append((train_step - version, len(ids) if isinstance(ids, list) else 1))
    if not turns and trajectory.initial_policy_version is not None:
        weight = completion_tokens(trajectory)
        turns.append((train_step - trajectory.initial_policy_version, weight))
    return [(age, max(weight, 1)) for age, weight in turns]


def mean_steps_off_policy(group: TrajectoryGroup, train_step: int) -> float | None:
    """The group's token-weighted mean age at `train_step` (None: nothing is versioned)."""
    turns = [turn for t in group.trajectories for turn in turn_ages(t, train_step)]
    weight = sum(w for _, w in turns)
    return sum(age * w for age, w in turns) / weight if weight else None


def is_stale(
    group: TrajectoryGroup,
    train_step: int,
    max_steps_off_policy: int | None,
    limit_mean_steps_off_policy: float | None = None,
) -> bool:
    """Past either bound: its oldest turn, or (ART 0.5.23) its mean token age."""
    if max_steps_off_policy is not None:
        sampled = sampled_step(group)
        if sampled is not None and train_step - sampled > max_steps_off_policy:
            return True
    if limit_mean_steps_off_policy is None:
        return False
    mean = mean_steps_off_policy(group, train_step)
    return mean is not None and mean > limit_mean_steps_off_policy


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
    "mean_steps_off_policy",
    "sampled_step",
    "staleness_metrics",
    "stamp_versions",
    "turn_ages",
]
