"""History keys under ART's taxonomy, and the migration of rows written before it.

The old rows are `tests/data/history_before_taxonomy/`, written by `art` before the
change (its README says how); the expected names are ART 0.5.23's (its model.py and
backends: `loss/train`, `data/step_*`, `time/step_backend_train_s`, `sft/gradient_step`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import art
from art.core.metrics.batch_metrics import group_metrics
from art.core.metrics.history_keys import (
    batch_keys,
    migrate_history_row,
    qualify_metric_key,
    trainer_keys,
)
from art.metrics_taxonomy import build_data_metrics_from_summary, summarize_trajectory_groups

OLD = (
    Path(__file__).resolve().parents[2]
    / "data"
    / "history_before_taxonomy"
    / "before-taxonomy"
    / "models"
    / "agent"
    / "history.jsonl"
)


@pytest.fixture(scope="module")
def old_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in OLD.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("key", "split", "expected"),
    [
        ("score", "val", "val/score"),
        ("loss/train", "val", "loss/train"),  # a section keeps its name
        ("costs/judge", "train", "costs/judge"),
        ("val/accuracy", "train", "val/accuracy"),  # so does a split
        ("mine/thing", "val", "val/mine/thing"),  # any other prefix is not ART's
        ("gradient_step", "sft", "sft/gradient_step"),
        ("sft/gradient_step", "sft", "sft/gradient_step"),
        ("loss/train", "sft", "sft/loss/train"),
    ],
)
def test_a_directly_logged_key_is_named_as_art_names_it(
    key: str, split: str, expected: str
) -> None:
    assert qualify_metric_key(key, split) == expected


def test_the_old_fixture_is_the_old_format(old_rows: list[dict[str, Any]]) -> None:
    assert [row["step"] for row in old_rows] == [0, 0, 1, 3, 3, 3]
    assert not any("training_step" in row for row in old_rows)
    assert "train/loss" in old_rows[1]
    assert "train_sft/batch" in old_rows[3]


def test_every_migrated_row_has_its_training_step_and_keeps_its_time(
    old_rows: list[dict[str, Any]],
) -> None:
    for old in old_rows:
        new = migrate_history_row(old)
        assert new["training_step"] == old["step"] == new["step"]
        assert new["recorded_at"] == old["recorded_at"]


def test_a_val_batch_row_takes_arts_data_and_group_names(old_rows: list[dict[str, Any]]) -> None:
    old, new = old_rows[0], migrate_history_row(old_rows[0])
    for kept in ("val/reward", "val/reward_std_dev", "val/exception_rate", "val/turns"):
        assert new[kept] == old[kept]
    assert new["val/data/step_num_scenarios"] == new["val/data/step_num_groups_submitted"] == 2
    # ART counts every rollout: the one that raised too
    assert new["val/data/step_num_trajectories"] == 5
    assert new["val/group/hops"] == old["val/group_hops"]
    assert new["val/num_exceptions"] == 1  # ours, under its split
    assert new["val/trainable_groups"] == 1  # ART records the trainable count for train only
    assert "data/step_num_groups_trainable" not in new
    for gone in ("val/num_groups", "val/num_trajectories", "val/group_hops"):
        assert gone not in new


def test_a_train_step_row_takes_arts_loss_time_and_data_names(
    old_rows: list[dict[str, Any]],
) -> None:
    first, second = (migrate_history_row(row) for row in old_rows[1:3])
    old = old_rows[1]
    assert first["loss/train"] == old["train/loss"]
    assert first["loss/grad_norm"] == old["train/grad_norm"]
    assert first["loss/entropy"] == old["train/entropy"]
    assert first["loss/importance_ratio_mean"] == old["train/mean_ratio"]
    assert first["loss/clipped_token_fraction"] == old["train/clip_fraction"]
    assert first["data/step_loss_bearing_tokens"] == old["train/tokens_trained"]
    assert first["time/step_backend_train_s"] == old["train/train_seconds"]
    assert first["data/step_num_groups_trainable"] == 2
    assert first["data/step_num_trajectories"] == 6
    assert first["train/reward"] == old["train/reward"]
    assert first["train/group/hops"] == 2.0
    for ours in ("policy_loss", "peak_memory_gb", "micro_batches", "completion_tokens"):
        assert first[f"train/{ours}"] == old[f"train/{ours}"]
    assert "time/step_rollout_s" not in first  # the first step has no rollout time
    assert second["time/step_rollout_s"] == old_rows[2]["train/rollout_seconds"]
    for gone in ("train/loss", "train/grad_norm", "train/train_seconds", "train/num_groups"):
        assert gone not in first


def test_sft_batch_rows_go_under_sft_with_a_gradient_step_from_one(
    old_rows: list[dict[str, Any]],
) -> None:
    rows = [migrate_history_row(row) for row in old_rows[3:5]]
    assert [row["sft/gradient_step"] for row in rows] == [1, 2]
    assert [row["sft/loss/train"] for row in rows] == [r["train_sft/loss"] for r in old_rows[3:5]]
    assert rows[0]["sft/loss/learning_rate"] == 1e-4
    assert rows[0]["sft/loss/grad_norm"] == old_rows[3]["train_sft/grad_norm"]
    assert rows[0]["sft/tokens"] == old_rows[3]["train_sft/tokens"]
    assert rows[0]["sft/batches"] == 2
    assert not [key for row in rows for key in row if key.startswith("train_sft/")]


def test_a_directly_logged_metric_and_a_users_val_loss_keep_their_names() -> None:
    row = {"step": 4, "recorded_at": "t", "val/score": 0.5, "val/loss": 0.25}
    assert migrate_history_row(row) == {**row, "training_step": 4}


def test_migration_is_idempotent_and_loses_no_value(old_rows: list[dict[str, Any]]) -> None:
    for old in old_rows:
        new = migrate_history_row(old)
        assert migrate_history_row(new) == new
        # carried by ART's data/ counts, and an SFT batch's index (now counted from 1)
        folded = {"num_groups", "num_trajectories", "batch"}
        lost = {
            value
            for key, value in old.items()
            if key.rpartition("/")[2] not in folded and value not in new.values()
        }
        assert not lost, (old, new)


def test_batch_keys_agree_with_arts_own_summary() -> None:
    groups = [
        art.TrajectoryGroup([art.Trajectory(reward=1.0), art.Trajectory(reward=0.0)]),
        art.TrajectoryGroup([art.Trajectory(reward=1.0), RuntimeError("rollout failed")]),
        art.TrajectoryGroup([RuntimeError("rollout failed")]),
    ]
    summary = summarize_trajectory_groups(groups)
    for split in ("train", "val"):
        ours = batch_keys(split, group_metrics(groups))
        arts = build_data_metrics_from_summary(summary, include_trainable_groups=split == "train")
        prefix = "" if split == "train" else f"{split}/"
        assert {k: v for k, v in ours.items() if "data/" in k} == {
            f"{prefix}{k}": v for k, v in arts.items()
        }


def test_trainer_names_apply_to_trainers_only() -> None:
    assert trainer_keys("train", {"loss": 1.0, "sequences_trained": 4.0}) == {
        "loss/train": 1.0,
        "train/sequences_trained": 4.0,
    }
    assert trainer_keys("val", {"loss": 1.0}) == {"val/loss": 1.0}
    assert trainer_keys("sft", {"batch": 0.0, "loss": 2.0}) == {
        "sft/gradient_step": 1.0,
        "sft/loss/train": 2.0,
    }


def test_an_old_history_reads_back_under_arts_names_through_the_store_and_art_show(
    tmp_path: Path,
) -> None:
    """The fixture's run, read as `ModelStore` and `art show` read it: migrated on read,
    the file left as it was."""
    from art.core.store.model_store import ModelStore
    from art.viewer import locate, read_project

    shutil.copytree(OLD.parents[3], tmp_path, dirs_exist_ok=True)
    path = tmp_path / "before-taxonomy" / "models" / "agent" / "history.jsonl"
    written = path.read_bytes()
    rows = ModelStore(tmp_path, "before-taxonomy", "agent").read_history()
    assert [row["training_step"] for row in rows] == [0, 0, 1, 3, 3, 3]
    assert rows[1]["loss/train"] == -1.6820560097694397
    assert rows[3]["sft/gradient_step"] == 1
    assert not [key for row in rows for key in row if key.startswith(("train/loss", "train_sft/"))]
    assert path.read_bytes() == written

    (model,) = read_project(locate(tmp_path))["models"]
    series = {s["name"]: s["points"] for s in model["metrics"]}
    assert series["loss/train"] == [[0, -1.6820560097694397], [1, 0.08934964916922827]]
    assert series["data/step_loss_bearing_tokens"] == [[0, 24.0], [1, 22.0]]
    assert series["val/group/hops"] == [[0, 2.0]]
    # an SFT call's two batches lie between the step before it and the step it made
    assert [point[:2] for point in series["sft/loss/train"]] == [
        [2.5, 5.115954399108887],
        [3.0, 4.963260650634766],
    ]
    assert series["sft/loss/train"][0][2] == "step 3, batch 1 of 2"
    for placed in ("training_step", "sft/gradient_step", "sft/batches", "train/loss"):
        assert placed not in series
    assert next(iter(series)) == "train/reward"  # rewards lead, as before


def test_an_old_users_train_loss_keeps_its_name_beside_our_old_trainers_rows(
    old_rows: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Only keys our old code wrote are renamed: a user's own `train/loss` (logged alone,
    or with a batch of groups) was never the trainer's and reads back as it was logged."""
    from art.core.store.model_store import ModelStore

    shutil.copytree(OLD.parents[3], tmp_path, dirs_exist_ok=True)
    path = tmp_path / "before-taxonomy" / "models" / "agent" / "history.jsonl"
    batch_with_loss = {
        **{k: v for k, v in old_rows[0].items() if k != "val/group_hops"},
        "step": 4,
    }
    batch_with_loss = {k.replace("val/", "train/"): v for k, v in batch_with_loss.items()} | {
        "train/loss": 0.5
    }
    alone = {"step": 5, "recorded_at": "2026-11-26T12:30:00+00:00", "train/loss": 0.25}
    with path.open("a") as file:
        file.write(json.dumps(batch_with_loss) + "\n" + json.dumps(alone) + "\n")

    rows = ModelStore(tmp_path, "before-taxonomy", "agent").read_history()
    assert rows[1]["loss/train"] == old_rows[1]["train/loss"]  # our old trainer's: renamed
    assert "train/loss" not in rows[1]
    assert rows[-2]["train/loss"] == 0.5
    assert "loss/train" not in rows[-2]
    assert rows[-2]["data/step_num_trajectories"] == 5  # the batch's counts still are ours
    assert rows[-1] == {**alone, "training_step": 5}
    # an old row of the user's own under `train_sft/` is not taken for an SFT batch
    users_sft = {"step": 6, "train_sft/loss": 1.0}
    assert migrate_history_row(users_sft) == {**users_sft, "training_step": 6}
