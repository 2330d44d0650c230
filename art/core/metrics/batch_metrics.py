"""The metrics `model.log` and `model.train` record for a batch of trajectory groups.

reward              mean reward over all trajectories
reward_std_dev      mean over groups of the reward's standard deviation within the group
                    (0 means GRPO has nothing to learn from)
exception_rate      rollouts that raised / all rollouts
num_groups          groups in the batch
num_trajectories    trajectories that finished
num_exceptions      rollouts that raised
trainable_groups    groups whose rewards differ, the only ones a GRPO step learns from
completion_tokens   mean sampled tokens per trajectory, where choices report them
<metric>            mean of each trajectory metric, over the trajectories that have it
group_<metric>      mean of each group metric (`TrajectoryGroup(metrics=...)`), over the
                    groups that have it and hold at least one trajectory (ART's rule)

A trajectory or group metric named `costs/...` is money spent, so it is summed, not
averaged (`group_costs`), and recorded through the model's `MetricsBuilder` under its own
name (ART's rule): it is left out of the averages.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from openai.types.chat.chat_completion import Choice

from ..data.trajectories import Trajectory, TrajectoryGroup

_COSTS = "costs/"


def completion_tokens(trajectory: Trajectory) -> int:
    """Tokens the model sampled in this trajectory, where the choices say."""
    total = 0
    histories = [trajectory.messages_and_choices] + [
        history.messages_and_choices for history in trajectory.additional_histories
    ]
    for items in histories:
        for item in items:
            if not isinstance(item, Choice):
                continue
            token_ids = (item.model_extra or {}).get("token_ids")
            if isinstance(token_ids, list):
                total += len(token_ids)
            elif item.logprobs is not None and item.logprobs.content is not None:
                total += len(item.logprobs.content)
    return total


def group_metrics(groups: list[TrajectoryGroup]) -> dict[str, float]:
    rewards = [trajectory.reward for group in groups for trajectory in group.trajectories]
    num_exceptions = sum(len(group.exceptions) for group in groups)
    rollouts = len(rewards) + num_exceptions
    group_stds = [
        statistics.pstdev(trajectory.reward for trajectory in group.trajectories)
        for group in groups
        if group.trajectories
    ]
    metrics: dict[str, float] = {
        "num_groups": len(groups),
        "num_trajectories": len(rewards),
        "num_exceptions": num_exceptions,
        "exception_rate": num_exceptions / rollouts if rollouts else 0.0,
        "trainable_groups": sum(1 for std in group_stds if std > 0),
    }
    if rewards:
        metrics["reward"] = statistics.fmean(rewards)
        metrics["reward_std_dev"] = statistics.fmean(group_stds)
        tokens = [completion_tokens(t) for group in groups for t in group.trajectories]
        if any(tokens):
            metrics["completion_tokens"] = statistics.fmean(tokens)
    sums: dict[str, list[float]] = defaultdict(list)
    for group in groups:
        for trajectory in group.trajectories:
            for key, value in trajectory.metrics.items():
                if not key.startswith(_COSTS):
                    sums[key].append(float(value))
    for key, values in sums.items():
        metrics.setdefault(key, statistics.fmean(values))
    per_group: dict[str, list[float]] = defaultdict(list)
    for group in groups:
        if group.trajectories:  # a group of exceptions only measured nothing (as in ART)
            for key, value in group.metrics.items():
                if not key.startswith(_COSTS):
                    per_group[key].append(float(value))
    for key, values in per_group.items():
        metrics.setdefault(f"group_{key}", statistics.fmean(values))
    return metrics


def group_costs(groups: list[TrajectoryGroup]) -> dict[str, float]:
    """The `costs/...` metrics of every trajectory and group, summed per name."""
    totals: dict[str, float] = defaultdict(float)
    for group in groups:
        every = [group.metrics, *(trajectory.metrics for trajectory in group.trajectories)]
        for metrics in every:
            for key, value in metrics.items():
                if key.startswith(_COSTS):
                    totals[key] += float(value)
    return dict(totals)
