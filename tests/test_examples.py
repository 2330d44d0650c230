"""Each example runs end to end, as a user would start it, on a small budget."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_trains_a_step_and_writes_its_plot(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "demo.py"),
            "--steps",
            "1",
            "--path",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "held-out reward before training" in result.stdout
    assert "step 1: reward" in result.stdout
    run = tmp_path / "art-demo" / "models" / "arithmetic"
    assert (run / "reward.png").stat().st_size > 10_000
    assert (run / "checkpoints" / "0001" / "adapter_model.safetensors").is_file()


def test_the_zero_label_example_trains_a_step_with_ruler_as_the_only_reward(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "ruler_zero_label.py"),
            "--steps",
            "1",
            "--path",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"ART_RULER_CACHE": "0"},  # leave the user cache alone
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mean RULER score" in result.stdout
    assert "RULER explanation: " in result.stdout
    run = tmp_path / "art-ruler" / "models" / "zero-label"
    assert (run / "checkpoints" / "0001" / "adapter_model.safetensors").is_file()
