"""ART 0.5.23's training settings change the steps the shared default model takes.

`TrainConfig.optimizer_save_interval` / `final_training_step` decide which checkpoints
keep the optimizer state; `TrainSFTConfig.assistant_turns="last"` trains fewer tokens
than "all" on the same conversations; `train_sft(log_metrics=False)` trains and writes
no history row. The settings themselves are checked in tests/core/test_art_current_names.py.
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


def history(model_dir: Path) -> list[dict[str, Any]]:
    path = model_dir / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def groups_of(model: art.TrainableModel) -> list[art.TrajectoryGroup]:
    """One group of three short rollouts through the model's client, rewarded 0, 1, 2."""
    client = model.openai_client()

    async def rollout(index: int) -> art.Trajectory:
        messages: list[Any] = [{"role": "user", "content": "Say a word."}]
        completion = await client.chat.completions.create(
            model=model.get_inference_name(), messages=messages, max_tokens=4
        )
        return art.Trajectory(
            messages_and_choices=[*messages, completion.choices[0]], reward=float(index)
        )

    return await art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout(i) for i in range(3))], pbar_desc=None
    )


async def test_optimizer_state_is_kept_only_in_the_checkpoints_the_interval_names(
    shared_backend: LocalBackend, unique_project: str
) -> None:
    model = art.TrainableModel(name="optim", project=unique_project, base_model=BASE)
    await model.register(shared_backend)
    groups = await groups_of(model)
    # Steps 1 and 4, 8, ... keep it (and final_training_step on; tested apart, cheaply).
    every_fourth = art.TrainConfig(learning_rate=1e-5, optimizer_save_interval=4)
    await model.train(groups, config=every_fourth)  # step 1: always kept
    await model.train(groups, config=every_fourth)  # step 2: the adapter only

    checkpoints = Path(shared_backend.path) / unique_project / "models" / "optim" / "checkpoints"
    kept = {step: (checkpoints / f"{step:04d}" / "optimizer.pt").is_file() for step in (1, 2)}
    assert kept == {1: True, 2: False}
    assert (checkpoints / "0002" / "adapter_model.safetensors").is_file()
    assert await model.get_step() == 2


async def test_sft_last_assistant_turn_trains_fewer_tokens_and_log_metrics_false_logs_none(
    shared_backend: LocalBackend, unique_project: str
) -> None:
    model = art.TrainableModel(name="sft", project=unique_project, base_model=BASE)
    await model.register(shared_backend)
    conversations = [
        art.Trajectory(
            messages_and_choices=[
                {"role": "user", "content": f"Describe the number {n}."},
                {"role": "assistant", "content": f"The number {n} is a whole number, odd or even."},
                {"role": "user", "content": "Shorter."},
                {"role": "assistant", "content": f"{n}."},
            ]
        )
        for n in (3, 4)
    ]
    all_turns = art.TrainSFTConfig(learning_rate=1e-5, batch_size=2)
    await model.train_sft(conversations, all_turns)
    await model.train_sft(conversations, all_turns.model_copy(update={"assistant_turns": "last"}))
    model_dir = Path(shared_backend.path) / unique_project / "models" / "sft"
    rows = [row for row in history(model_dir) if "sft/tokens" in row]
    assert len(rows) == 2
    assert rows[1]["sft/tokens"] < rows[0]["sft/tokens"]

    await model.train_sft(conversations, all_turns, log_metrics=False)
    assert await model.get_step() == 3  # trained and saved ...
    assert len([row for row in history(model_dir) if "sft/tokens" in row]) == 2  # ... unlogged
