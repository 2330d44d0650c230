"""`Model.update_wandb_config` (ART 0.5.23) reaches the model's real W&B run, offline.

The config given before the run starts is in it from its first record; the config given
after joins it; the run file is read back as `wandb sync` would read it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from observe_helpers import run_python, wandb_records

SCRIPT = """
import asyncio
import art
from art.integrations.observability import finish_wandb_runs

async def main():
    model = art.Model(name="agent", project="obs", report_metrics=["wandb"], base_path=PATH)
    model.update_wandb_config({"dataset": {"name": "gsm8k"}, "lr": 1e-05})
    await model.log(metrics={"score": 1.0}, step=0)  # the run starts here, with the config
    model.update_wandb_config({"dataset": {"split": "train"}})  # the open run gets it
    await model.log(metrics={"score": 2.0}, step=1)

asyncio.run(main())
finish_wandb_runs(60)
"""


def config_updates(run_file: Path) -> dict[str, Any]:
    """Every config key the run file records, with its last value."""
    config: dict[str, Any] = {}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        items = record.run.config.update if kind == "run" else []
        if kind == "config":
            items = record.config.update
        for item in items:
            key = item.key or "/".join(item.nested_key)
            config[key] = json.loads(item.value_json)
    return config


def test_the_config_given_before_and_after_the_run_starts_is_the_runs(tmp_path: Path) -> None:
    wandb_dir = tmp_path / "wb"
    wandb_dir.mkdir()
    code = SCRIPT.replace("PATH", repr(str(tmp_path / ".art")))
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_API_KEY": ""}
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr

    (run_file,) = sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
    config = config_updates(run_file)
    assert config["lr"] == 1e-05
    assert config["dataset"] == {"name": "gsm8k", "split": "train"}
    # The rows went to history.jsonl under base_path (no backend) as well.
    history = tmp_path / ".art" / "obs" / "models" / "agent" / "history.jsonl"
    assert [json.loads(line)["val/score"] for line in history.read_text().splitlines()] == [1, 2]
