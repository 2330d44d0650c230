"""`model.train_sft` writes ART 0.5.23's rows: one `sft/` row per batch, then the call's
averaged row under `train` at the step it made (ART's `Model.train_sft`: the mean of the
batches' metrics, with `time/step_backend_train_s` the wall time of the whole call).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import art
from art.local import LocalBackend

pytestmark = pytest.mark.model  # trains the shared default model

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _history(model_dir: Path) -> list[dict[str, Any]]:
    path = model_dir / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_sft_logs_each_batch_then_arts_averaged_train_row(
    shared_backend: LocalBackend, unique_project: str
) -> None:
    model = art.TrainableModel(name="sft-avg", project=unique_project, base_model=BASE)
    await model.register(shared_backend)
    examples = [
        art.Trajectory(
            messages_and_choices=[
                {"role": "user", "content": f"Name the number {n}."},
                {"role": "assistant", "content": f"{n}."},
            ]
        )
        for n in (1, 2, 3)
    ]
    await model.train_sft(examples, art.TrainSFTConfig(learning_rate=1e-5, batch_size=1))
    model_dir = Path(shared_backend.path) / unique_project / "models" / "sft-avg"
    rows = _history(model_dir)
    batches = [row for row in rows if "sft/gradient_step" in row]
    assert [row["sft/gradient_step"] for row in batches] == [1, 2, 3]
    (summary,) = [row for row in rows if "loss/train" in row]
    assert rows[-1] is summary  # after the last batch, at the step the call made
    assert summary["step"] == summary["training_step"] == await model.get_step() == 1
    for key in ("loss/train", "loss/grad_norm", "loss/learning_rate"):
        assert summary[key] == pytest.approx(
            sum(row[f"sft/{key}"] for row in batches) / len(batches)
        ), key
    assert summary["time/step_backend_train_s"] > 0
    assert not [key for key in summary if key.startswith("sft/")]

    await model.train_sft(examples[:1], log_metrics=False)  # neither kind of row
    assert _history(model_dir) == rows
