"""ART's metric taxonomy: the names its metrics go under, and the step summaries behind them.

ART groups a run's metrics in sections (`data/`, `time/`, `costs/`, `loss/`, ...) beside
the split-scoped ones (`train/reward`, `val/exception_rate`, ...). This module holds the
pieces of that scheme other code builds on (ART's `art.metrics_taxonomy`):

    TRAIN_GRADIENT_STEPS_KEY        data/step_num_gradient_steps: the same in every sample
                                    of one step, so it is never averaged
    SFT_METRIC_PREFIX               "sft": the section per-batch SFT rows are logged under
    SFT_GRADIENT_STEP_KEY           "gradient_step": a batch's index within its SFT call
    SFT_WANDB_GRADIENT_STEP_KEY     "sft/gradient_step": that index as a W&B key
    average_metric_samples          the mean of each key over per-micro-step samples
    summarize_trajectory_groups     a batch's counts (TrajectoryBatchSummary)
    build_data_metrics_from_summary those counts as `data/step_*` metrics
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..data.errors import ArtValueError
from ..data.trajectories import MetadataValue, TrajectoryGroup

TRAIN_GRADIENT_STEPS_KEY = "data/step_num_gradient_steps"
SFT_METRIC_PREFIX = "sft"
SFT_GRADIENT_STEP_KEY = "gradient_step"
SFT_WANDB_GRADIENT_STEP_KEY = f"{SFT_METRIC_PREFIX}/{SFT_GRADIENT_STEP_KEY}"

# Keys that describe the whole step rather than one sample of it: every sample must
# agree, and the step's value is that one value, not a mean.
_STEP_CONSTANT_KEYS = frozenset({TRAIN_GRADIENT_STEPS_KEY})

# Rewards closer than this count as equal: a group of them teaches GRPO nothing.
_REWARD_TOLERANCE = 1e-12


def average_metric_samples(metric_samples: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The mean of each key over the samples that have it.

    A key that is constant within a step (`TRAIN_GRADIENT_STEPS_KEY`) keeps its value;
    samples that disagree on it raise `ArtValueError` (a ValueError).
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    constants: dict[str, float] = {}
    for sample in metric_samples:
        for key, raw in sample.items():
            value = float(raw)
            if key in _STEP_CONSTANT_KEYS:
                seen = constants.setdefault(key, value)
                if seen != value:
                    raise ArtValueError(
                        f"metric_samples[{key!r}]",
                        f"must be the same in every sample of a step, got {seen} and {value}",
                        "Report the step's gradient-step count once, unchanged, in each sample",
                    )
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + 1
    return {key: constants.get(key, sums[key] / counts[key]) for key in sums}


@dataclass(frozen=True)
class TrajectoryBatchSummary:
    """What one batch of trajectory groups holds.

    `num_scenarios` counts groups (one scenario each, as ART counts them);
    `num_trajectories` counts rollouts, the ones that raised included; `scenario_ids`
    are the distinct `scenario_id` metadata values, in first-seen order.
    """

    num_scenarios: int
    num_trajectories: int
    num_groups_submitted: int
    num_groups_trainable: int
    scenario_ids: list[str]


def summarize_trajectory_groups(
    trajectory_groups: Iterable[TrajectoryGroup],
) -> TrajectoryBatchSummary:
    """Count a batch's groups, rollouts and trainable groups, and collect its scenario ids.

    A group is trainable when it has at least two trajectories whose rewards differ.
    A group's scenario id is `scenario_id` in its metadata, or else in the metadata of
    its first trajectory that has one.
    """
    groups = list(trajectory_groups)
    scenario_ids: dict[str, None] = {}  # an ordered set
    for group in groups:
        scenario_id = _scenario_id(group)
        if scenario_id is not None:
            scenario_ids.setdefault(scenario_id)
    return TrajectoryBatchSummary(
        num_scenarios=len(groups),
        num_trajectories=sum(len(g.trajectories) + len(g.exceptions) for g in groups),
        num_groups_submitted=len(groups),
        num_groups_trainable=sum(1 for group in groups if _rewards_differ(group)),
        scenario_ids=list(scenario_ids),
    )


def build_data_metrics_from_summary(
    summary: TrajectoryBatchSummary, *, include_trainable_groups: bool
) -> dict[str, float]:
    """The summary as ART's `data/step_*` metrics; the trainable-group count only when asked
    (ART records it for the train split)."""
    metrics = {
        "data/step_num_scenarios": float(summary.num_scenarios),
        "data/step_num_trajectories": float(summary.num_trajectories),
        "data/step_num_groups_submitted": float(summary.num_groups_submitted),
    }
    if include_trainable_groups:
        metrics["data/step_num_groups_trainable"] = float(summary.num_groups_trainable)
    return metrics


def build_training_summary_metrics(
    summary: TrajectoryBatchSummary, *, include_trainable_groups: bool
) -> dict[str, float]:
    """The same metrics as `build_data_metrics_from_summary` (ART keeps both names)."""
    return build_data_metrics_from_summary(
        summary, include_trainable_groups=include_trainable_groups
    )


def _rewards_differ(group: TrajectoryGroup) -> bool:
    rewards = [trajectory.reward for trajectory in group.trajectories]
    return any(abs(reward - rewards[0]) > _REWARD_TOLERANCE for reward in rewards[1:])


def _scenario_id(group: TrajectoryGroup) -> str | None:
    for metadata in (group.metadata, *(t.metadata for t in group.trajectories)):
        found = _metadata_scenario_id(metadata)
        if found is not None:
            return found
    return None


def _metadata_scenario_id(metadata: Mapping[str, MetadataValue]) -> str | None:
    value = metadata.get("scenario_id")
    return None if value is None else str(value)


__all__ = [
    "SFT_GRADIENT_STEP_KEY",
    "SFT_METRIC_PREFIX",
    "SFT_WANDB_GRADIENT_STEP_KEY",
    "TRAIN_GRADIENT_STEPS_KEY",
    "TrajectoryBatchSummary",
    "average_metric_samples",
    "build_data_metrics_from_summary",
    "build_training_summary_metrics",
    "summarize_trajectory_groups",
]
