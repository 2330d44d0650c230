"""`art.model`'s taxonomy constants (ART 0.5.23's), and W&B getting what ART sends it.

ART sends W&B its canonical keys and prefixes and the user's own metrics (trajectory and
group metrics, and those logged directly); history.jsonl keeps every key. The W&B case
runs in a fresh interpreter with the real wandb library, offline, and reads the run file
back as `wandb sync` would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from observe_helpers import read_wandb_run, run_python

import art
import art.model
from art.core.metrics import history_keys


def test_art_model_exports_arts_taxonomy_constants_from_one_source() -> None:
    assert art.model.METRIC_SECTIONS is history_keys.METRIC_SECTIONS
    assert frozenset({"train", "val", "test"}) == art.model.METRIC_SPLITS
    assert {"loss", "costs", "data", "time", "sft"} - art.model.METRIC_SECTIONS == {"sft"}
    assert art.model.WANDB_CANONICAL_METRIC_PREFIXES == ("costs/cum/", "sft/")
    keys = art.model.WANDB_CANONICAL_METRIC_KEYS
    assert len(keys) == 70  # ART 0.5.23's: 60 named, sft/gradient_step, 3 per split
    assert {"training_step", "sft/gradient_step", "loss/train", "test/reward_std_dev"} <= keys
    # Our own batch counts are not ART's canonical keys, so they stay out of W&B.
    assert not {"data/step_num_trajectories", "val/num_exceptions"} & keys
    for name in (
        "METRIC_SECTIONS",
        "METRIC_SPLITS",
        "WANDB_CANONICAL_METRIC_KEYS",
        "WANDB_CANONICAL_METRIC_PREFIXES",
    ):
        assert name in art.model.__all__


def test_the_users_keys_are_its_trajectory_group_and_direct_metrics() -> None:
    group = art.TrajectoryGroup(
        [
            art.Trajectory(
                messages_and_choices=[{"role": "user", "content": "q"}],
                reward=1.0,
                metrics={"turns": 2, "costs/judge": 0.1},
            )
        ],
        metrics={"hops": 1},
    )
    keys = history_keys.user_metric_keys("val", [group], {"score": 1.0, "loss/kl": 0.2})
    assert keys == {"val/turns", "val/group/hops", "val/score", "loss/kl"}
    row = {
        "val/turns": 2.0,
        "val/reward": 1.0,
        "val/num_exceptions": 0.0,
        "val/data/step_num_trajectories": 1.0,
        "costs/eval/judge": 0.1,
        "costs/cum/eval/judge": 0.1,
        "sft/tokens": 4.0,
    }
    assert history_keys.wandb_metrics(row, keys) == {
        "val/turns": 2.0,
        "val/reward": 1.0,
        "costs/cum/eval/judge": 0.1,
        "sft/tokens": 4.0,
    }


LOG_VAL = """
import asyncio
import art
from art.integrations.observability import finish_wandb_runs

async def main():
    model = art.Model(name="agent", project="obs", report_metrics=["wandb"], base_path=PATH)
    group = art.TrajectoryGroup(
        [
            art.Trajectory(
                messages_and_choices=[{"role": "user", "content": f"q{i}"}],
                reward=float(i),
                metrics={"turns": i + 1, "costs/judge": 0.5},
            )
            for i in range(2)
        ],
        metrics={"hops": 3},
    )
    await model.log([group], split="val", step=0, metrics={"score": 0.75})

asyncio.run(main())
finish_wandb_runs(60)
"""


def test_w_and_b_gets_arts_canonical_keys_and_the_users_history_keeps_every_key(
    tmp_path: Path,
) -> None:
    art_path, wandb_dir = tmp_path / ".art", tmp_path / "wb"
    wandb_dir.mkdir()
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_API_KEY": ""}
    result = run_python(LOG_VAL.replace("PATH", repr(str(art_path))), env)
    assert result.returncode == 0, result.stderr
    (row,) = [
        json.loads(line)
        for line in (art_path / "obs/models/agent/history.jsonl").read_text().splitlines()
    ]
    (run_file,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    (sent,) = read_wandb_run(run_file).history
    sent_keys = {k for k in sent if not k.startswith("_")}
    assert sent_keys == {
        "training_step",
        "val/reward",
        "val/reward_std_dev",
        "val/exception_rate",
        "val/turns",
        "val/group/hops",
        "val/score",
        *(k for k in row if k.startswith("costs/cum/")),
    }
    assert any(k.startswith("costs/cum/") for k in sent_keys)
    # history.jsonl keeps what W&B is not sent: the counts and the step's own costs.
    kept_out = set(row) - sent_keys - {"step", "recorded_at"}
    assert "val/data/step_num_trajectories" in kept_out
    assert "val/num_exceptions" in kept_out
    assert any(k.startswith("costs/") and not k.startswith("costs/cum/") for k in kept_out)
    for key in sent_keys:
        assert sent[key] == pytest.approx(row[key]), key
