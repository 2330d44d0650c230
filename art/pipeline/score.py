"""A step's sample-efficiency figures, as ART 0.5.23's PipelineTrainer logs them.

- `sample_efficiency/accepted_groups_per_step`: groups trained this step.
- `sample_efficiency/batch_factor`: how much a step of this batch is worth beside the
  reference batch (`score_reference_groups_per_step` groups of
  `score_reference_rollouts_per_group` rollouts; the batch's own group size where that is
  None): `(G_ref + B / R_ref) / (G + B / R)`, with B = 300 rollouts, the critical rollout
  batch size ART takes from reported GRPO/RLVR runs. Above 1 the batch is smaller than the
  reference (each rollout counts more); 1 where `score_reference_groups_per_step` is None.
- `offpolicy/token_weighted_policy_age_steps` (and `..._p95_steps`): the sampled tokens'
  mean (95th percentile) age in steps at the step they train at.
- `sample_efficiency/freshness_discount`: 1 / mean(exp(age / 8)) over the sampled tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.data.trajectories import TrajectoryGroup
from ._staleness import turn_ages

CRITICAL_ROLLOUT_BATCH_SIZE = 300.0
FRESHNESS_TAU_STEPS = 8.0


@dataclass(frozen=True)
class ScoreReference:
    """The batch a step is measured against (ART's `score_reference_*` arguments)."""

    groups_per_step: float | None = 8.0
    rollouts_per_group: float | None = None

    def batch_factor(self, groups: float, rollouts_per_group: float | None) -> float:
        if (
            self.groups_per_step is None
            or groups <= 0
            or rollouts_per_group is None
            or rollouts_per_group <= 0
        ):
            return 1.0
        reference_rollouts = self.rollouts_per_group or rollouts_per_group
        reference = self.groups_per_step + CRITICAL_ROLLOUT_BATCH_SIZE / reference_rollouts
        current = groups + CRITICAL_ROLLOUT_BATCH_SIZE / rollouts_per_group
        return reference / current


def _percentile(points: list[tuple[float, float]], fraction: float) -> float:
    """The weighted `fraction` percentile of (value, weight) points."""
    ordered = sorted(points)
    target = fraction * sum(weight for _, weight in ordered)
    running = 0.0
    for value, weight in ordered:
        running += weight
        if running >= target:
            return value
    return ordered[-1][0]


def score_metrics(
    batch: list[TrajectoryGroup], train_step: int, reference: ScoreReference
) -> dict[str, float]:
    """The figures above for `batch`, trained at `train_step`."""
    sizes = [len(group.trajectories) for group in batch]
    rollouts_per_group = sum(sizes) / len(sizes) if sizes else None
    metrics = {
        "sample_efficiency/accepted_groups_per_step": float(len(batch)),
        "sample_efficiency/batch_factor": reference.batch_factor(
            float(len(batch)), rollouts_per_group
        ),
    }
    turns = [
        (float(age), float(weight))
        for group in batch
        for trajectory in group.trajectories
        for age, weight in turn_ages(trajectory, train_step)
    ]
    total = sum(weight for _, weight in turns)
    if not total:
        return metrics
    growth = sum(math.exp(min(max(age, 0.0) / FRESHNESS_TAU_STEPS, 700.0)) * w for age, w in turns)
    metrics["offpolicy/token_weighted_policy_age_steps"] = sum(a * w for a, w in turns) / total
    metrics["offpolicy/token_weighted_policy_age_p95_steps"] = _percentile(turns, 0.95)
    metrics["sample_efficiency/freshness_discount"] = total / growth
    return metrics


__all__ = ["CRITICAL_ROLLOUT_BATCH_SIZE", "ScoreReference", "score_metrics"]
