"""The keys of a `history.jsonl` row: ART's taxonomy for ART's metrics, ours beside them.

ART 0.5.23 names a row's metrics two ways. Metrics of a section keep the section as their
first part, whatever the split: `loss/train`, `loss/grad_norm`, `time/step_backend_train_s`,
`data/step_num_groups_trainable`, `costs/...`. Everything else is put under its split:
`train/reward`, `val/exception_rate`, `val/<trajectory metric>`, `val/group/<group metric>`,
and SFT batches under `sft/` (`sft/loss/train`, `sft/gradient_step`). Every row also holds
`training_step`, the step it belongs to, which W&B plots every metric against.

Our own metrics, which ART has no name for (`tokens_trained`, `peak_memory_gb`,
`num_exceptions`, `completion_tokens`, ...), keep their names under the split:
`train/peak_memory_gb`, `sft/tokens`.

Rows written before this naming (up to commit f6168ca) have no `training_step` and put
every key under its split (`train/loss`, `train_sft/loss`, `val/group_hops`):
`migrate_history_row` renames them as they are read, but only the keys our old code
wrote: a batch's counts and group averages where a split holds all of a batch's counts,
the trainer's names only in a `train` row that has the trainer's `train_seconds`, and
`train_sft/` rows that have their `batch` and `batches`. A user's own `train/loss`,
logged directly, keeps its name.

W&B gets the part of a row ART sends it (`wandb_metrics`): ART's canonical keys and
prefixes, and the user's own metrics (`user_metric_keys`); history.jsonl keeps them all.

This module names keys only; `ModelStore` reads and writes the rows.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .metrics_taxonomy import (
    SFT_GRADIENT_STEP_KEY,
    SFT_METRIC_PREFIX,
    SFT_WANDB_GRADIENT_STEP_KEY,
)

if TYPE_CHECKING:
    from ..data.trajectories import TrajectoryGroup

# The first parts that make a key a section's, not a split's (ART 0.5.23's model.py).
METRIC_SECTIONS = frozenset(
    {
        "costs",
        "data",
        "discarded",
        "loss",
        "objective",
        "offpolicy",
        "pipeline",
        "pipeline_settings",
        "queue",
        "sample_efficiency",
        "throughput",
        "time",
        "vllm",
    }
)
METRIC_SPLITS = frozenset({"train", "val", "test"})
TRAINING_STEP_KEY = "training_step"

# What ART sends to W&B besides the user's own metrics (ART 0.5.23's model.py): these
# keys, and any key under these prefixes. Everything else stays in history.jsonl only.
WANDB_CANONICAL_METRIC_KEYS = frozenset(
    {
        TRAINING_STEP_KEY,
        SFT_WANDB_GRADIENT_STEP_KEY,
        "objective/score",
        "sample_efficiency/accepted_groups_per_step",
        "sample_efficiency/batch_factor",
        "sample_efficiency/freshness_discount",
        "offpolicy/token_weighted_policy_age_steps",
        "offpolicy/token_weighted_policy_age_p95_steps",
        "throughput/accepted_train_tok_per_s",
        "throughput/train_nonpadding_logical_tok_per_s",
        "throughput/train_loss_bearing_tok_per_s",
        "throughput/train_executed_tok_equiv_per_s",
        "throughput/train_nominal_capacity_tok_per_s",
        "data/step_trainable_assistant_tokens",
        "data/step_nonpadding_logical_tokens",
        "data/step_loss_bearing_tokens",
        "data/step_executed_token_equivalents",
        "data/step_nominal_schedule_capacity_tokens",
        "data/step_dummy_executed_token_equivalents",
        "data/step_dummy_schedule_capacity_tokens",
        "data/step_unused_packed_capacity_tokens",
        "data/step_unused_and_dummy_ratio",
        "data/cum/num_unique_scenarios",
        "data/cum/num_scenarios",
        "data/cum/num_gradient_steps",
        "discarded/cum/stale_groups",
        "discarded/cum/zero_variance_groups",
        "discarded/step/stale_groups",
        "discarded/step/zero_variance_groups",
        "discarded/rate/stale_groups",
        "discarded/rate/zero_variance_groups",
        "time/step_wall_s",
        "time/cum/wall_s",
        "time/step_collect_batch_s",
        "time/step_backend_train_s",
        "time/step_rollout_idle_s",
        "pipeline_settings/num_rollout_workers",
        "pipeline_settings/min_batch_size",
        "pipeline_settings/max_batch_size",
        "pipeline_settings/target_groups_per_step",
        "pipeline_settings/queue_maxsize",
        "queue/actual_stale_fraction",
        "queue/put_wait_frac",
        "queue/put_wait_s",
        "loss/train",
        "loss/entropy",
        "loss/kl_div",
        "loss/kl_policy_ref",
        "loss/grad_norm",
        "loss/learning_rate",
        "loss/importance_ratio_mean",
        "loss/importance_ratio_p95",
        "loss/importance_ratio_p99",
        "loss/clipped_token_fraction",
        "vllm/prompt_tok_per_s",
        "vllm/completion_tok_per_s",
        "vllm/num_requests_running",
        "vllm/num_requests_waiting",
        "vllm/num_requests_waiting_capacity",
        "vllm/prefix_cache_hit_rate",
        "vllm/kv_cache_usage_perc",
        *(
            f"{split}/{metric}"
            for split in sorted(METRIC_SPLITS)
            for metric in ("reward", "reward_std_dev", "exception_rate")
        ),
    }
)
WANDB_CANONICAL_METRIC_PREFIXES = ("costs/cum/", f"{SFT_METRIC_PREFIX}/")

# The split our SFT rows were written under before they took ART's.
LEGACY_SFT_SPLIT = "train_sft"

# What our trainer reports, by ART's name (a train step's row).
_TRAINER_KEYS = {
    "loss": "loss/train",  # the objective minimized: the policy loss, plus beta * kl
    "entropy": "loss/entropy",
    "kl": "loss/kl_div",
    "kl_policy_ref": "loss/kl_policy_ref",
    "grad_norm": "loss/grad_norm",
    "learning_rate": "loss/learning_rate",
    "mean_ratio": "loss/importance_ratio_mean",
    "clip_fraction": "loss/clipped_token_fraction",
    "tokens_trained": "data/step_loss_bearing_tokens",
    "train_seconds": "time/step_backend_train_s",
    "rollout_seconds": "time/step_rollout_s",
}
# What an SFT batch reports, by ART's name under `sft/`.
SFT_TRAINER_KEYS = {
    "loss": "loss/train",
    "entropy": "loss/entropy",
    "grad_norm": "loss/grad_norm",
    "learning_rate": "loss/learning_rate",
}
_ROW_FIELDS = ("step", "recorded_at")
# What tells an old row's keys written by our code from a user's, split by split: a
# batch's figures always had all five counts, a trainer's step always its
# `train_seconds`, an SFT batch its `batch` and `batches`.
_OLD_BATCH_MARKERS = frozenset(
    {"num_groups", "num_trajectories", "num_exceptions", "exception_rate", "trainable_groups"}
)
_OLD_TRAINER_MARKER = "train_seconds"
_OLD_SFT_MARKERS = frozenset({"batch", "batches"})


def qualify_metric_key(key: str, split: str) -> str:
    """The history key of a metric logged directly (`model.log(metrics=...)`), as ART names it.

    A key whose first part is a section (`loss/...`, `costs/...`) or a split
    (`val/...`) is kept; any other is put under `split`. Under the `sft` split only
    `sft/...` keys are kept.
    """
    head = key.split("/", 1)[0]
    if split == SFT_METRIC_PREFIX:
        return key if head == SFT_METRIC_PREFIX else f"{split}/{key}"
    if "/" in key and (head in METRIC_SECTIONS or head in METRIC_SPLITS):
        return key
    return f"{split}/{key}"


def batch_keys(split: str, figures: Mapping[str, float]) -> dict[str, float]:
    """A batch's figures (`art.core.metrics.batch_metrics.group_metrics`), keyed as ART keys them.

    The counts become ART's `data/step_*` metrics (split-prefixed outside `train`, and
    the trainable-group count only for `train`, as ART does); `num_trajectories` there
    counts every rollout, the ones that raised included. `group_<name>` becomes
    `<split>/group/<name>`; the rest go under the split.
    """
    figures = dict(figures)
    row: dict[str, float] = {}
    data = "data" if split == "train" else f"{split}/data"
    if "num_groups" in figures:
        groups = figures.pop("num_groups")
        row[f"{data}/step_num_scenarios"] = groups
        row[f"{data}/step_num_groups_submitted"] = groups
    if "num_trajectories" in figures:
        finished = figures.pop("num_trajectories")
        row[f"{data}/step_num_trajectories"] = finished + figures.get("num_exceptions", 0)
    if split == "train" and "trainable_groups" in figures:
        row["data/step_num_groups_trainable"] = figures.pop("trainable_groups")
    for key, value in figures.items():
        if key.startswith("group_"):
            row[f"{split}/group/{key.removeprefix('group_')}"] = value
        else:
            row[f"{split}/{key}"] = value
    return row


def trainer_keys(split: str, figures: Mapping[str, float]) -> dict[str, float]:
    """A trainer's figures (one RL step's, or one SFT batch's), keyed as ART keys them.

    Under `sft`, `batch` (0-based) becomes ART's `sft/gradient_step` (1-based). Figures
    ART has no name for stay ours, under the split.
    """
    row: dict[str, float] = {}
    names = SFT_TRAINER_KEYS if split == SFT_METRIC_PREFIX else _TRAINER_KEYS
    for key, value in figures.items():
        head = key.split("/", 1)[0]
        if "/" in key and (head in METRIC_SECTIONS or head in METRIC_SPLITS):
            row[key] = value  # named already: a remote trainer's (art run, art serve), as ART's
        elif split == SFT_METRIC_PREFIX and key == "batch":
            row[f"{SFT_METRIC_PREFIX}/{SFT_GRADIENT_STEP_KEY}"] = value + 1
        elif key in names and split in (SFT_METRIC_PREFIX, "train"):
            art_key = names[key]
            row[f"{split}/{art_key}" if split == SFT_METRIC_PREFIX else art_key] = value
        else:
            row[f"{split}/{key}"] = value
    return row


def user_metric_keys(
    split: str, groups: Iterable[TrajectoryGroup], metrics: Mapping[str, float] | None = None
) -> frozenset[str]:
    """The history keys of a row that are the user's own, as ART counts them: each
    trajectory metric (`<split>/<name>`), each group metric (`<split>/group/<name>`) and
    each metric logged directly; `costs/...` are the builder's, never the user's."""
    keys: set[str] = set()
    for group in groups:
        keys.update(f"{split}/group/{k}" for k in group.metrics if not k.startswith("costs/"))
        for trajectory in group.trajectories:
            keys.update(f"{split}/{k}" for k in trajectory.metrics if not k.startswith("costs/"))
    keys.update(qualify_metric_key(k, split) for k in metrics or {} if not k.startswith("costs/"))
    return frozenset(keys)


def wandb_metrics(row: Mapping[str, float], user_keys: Collection[str]) -> dict[str, float]:
    """The part of a history row ART sends to W&B: its canonical keys and prefixes, and
    the user's own metrics (`user_metric_keys`); the rest stays in history.jsonl."""
    return {
        key: value
        for key, value in row.items()
        if key in WANDB_CANONICAL_METRIC_KEYS
        or key.startswith(WANDB_CANONICAL_METRIC_PREFIXES)
        or key in user_keys
    }


def migrate_history_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as this version writes it. A row that has `training_step` is already so and
    comes back unchanged; an older row is renamed (see the module docstring)."""
    if TRAINING_STEP_KEY in row:
        return dict(row)
    migrated: dict[str, Any] = {field: row[field] for field in _ROW_FIELDS if field in row}
    by_split: dict[str, dict[str, Any]] = {}
    for key, value in row.items():
        if key in _ROW_FIELDS:
            continue
        split, slash, metric = key.partition("/")
        if not slash:
            migrated[key] = value  # no split to read; written by hand, kept as it is
            continue
        by_split.setdefault(split, {})[metric] = value
    for split, figures in by_split.items():
        if split == LEGACY_SFT_SPLIT and figures.keys() >= _OLD_SFT_MARKERS:
            migrated.update(trainer_keys(SFT_METRIC_PREFIX, figures))
        elif figures.keys() >= _OLD_BATCH_MARKERS:
            ours = split == "train" and _OLD_TRAINER_MARKER in figures
            trained = {k: v for k, v in figures.items() if ours and k in _TRAINER_KEYS}
            counted = {k: v for k, v in figures.items() if k not in trained}
            migrated.update(batch_keys(split, counted))
            migrated.update(trainer_keys(split, trained))
        else:  # not written by our old code: the user's own, named as logged
            migrated.update({f"{split}/{metric}": value for metric, value in figures.items()})
    if isinstance(row.get("step"), int):
        migrated[TRAINING_STEP_KEY] = row["step"]
    return migrated


__all__ = [
    "LEGACY_SFT_SPLIT",
    "METRIC_SECTIONS",
    "METRIC_SPLITS",
    "SFT_TRAINER_KEYS",
    "TRAINING_STEP_KEY",
    "WANDB_CANONICAL_METRIC_KEYS",
    "WANDB_CANONICAL_METRIC_PREFIXES",
    "batch_keys",
    "migrate_history_row",
    "qualify_metric_key",
    "trainer_keys",
    "user_metric_keys",
    "wandb_metrics",
]
