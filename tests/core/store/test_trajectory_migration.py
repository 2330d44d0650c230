"""`art.utils.trajectory_migration` and `art migrate`: an ART 0.4 run moved to Parquet.

The run is written as ART 0.4.0's LocalBackend left it (read from its wheel): `model.json`
(the model's `model_dump()`), and per logged step `trajectories/{split}/{step:04d}.jsonl`,
one `{"trajectories": [...]}` line per group, each sampled Choice as its `to_dict()`
without logprobs; no `history.jsonl` (ART 0.4 sent metrics to W&B only). After the
migration `art show`'s own reader must show every step, group and sampled turn.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from helpers import WEATHER_TOOL, tool_trajectory
from openai.types.chat.chat_completion import Choice

import art
from art.cli import main
from art.utils.trajectory_logging import read_trajectory_groups_parquet
from art.utils.trajectory_migration import (
    MigrationResult,
    auto_migrate_on_register,
    deserialize_trajectory_groups,
    migrate_all_models,
    migrate_jsonl_to_parquet,
    migrate_model_dir,
    serialize_trajectory_groups,
)
from art.viewer import build_page
from art.viewer._read import locate, read_project

CALL = {
    "id": "call_7",
    "function": {"arguments": '{"city": "Paris"}', "name": "get_weather"},
    "type": "function",
}


def _art_0_4_trajectory(reward: float) -> dict[str, Any]:
    return {
        "reward": reward,
        "metrics": {"turns": 2},
        "metadata": {"city": "Paris"},
        "messages_and_choices": [
            {"role": "system", "content": "You answer weather questions."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "finish_reason": "tool_calls",
                "index": 0,
                "message": {"content": None, "role": "assistant", "tool_calls": [CALL]},
            },
            {"role": "tool", "tool_call_id": "call_7", "content": "sunny, 21C"},
            {
                "finish_reason": "stop",
                "index": 0,
                "message": {"content": "It is sunny in Paris.", "role": "assistant"},
            },
        ],
        "tools": [WEATHER_TOOL],
        "additional_histories": [],
        "logs": [f"reward {reward}"],
    }


def write_art_0_4_run(base: Path) -> Path:
    """`base/weather/models/agent/`, as ART 0.4.0 left it after two train steps and a val."""
    model_dir = base / "weather" / "models" / "agent"
    model_dir.mkdir(parents=True)
    (model_dir / "model.json").write_text(
        json.dumps(
            {
                "name": "agent",
                "project": "weather",
                "config": None,
                "inference_api_key": None,
                "inference_base_url": None,
                "inference_model_name": None,
                "base_model": "Qwen/Qwen2.5-7B-Instruct",
            }
        )
    )
    logs = {
        ("train", 0): [[1.0, 0.0], [0.5, 0.5]],
        ("train", 1): [[1.0, 0.25]],
        ("val", 0): [[0.75]],
    }
    for (split, step), group_rewards in logs.items():
        lines = [
            json.dumps({"trajectories": [_art_0_4_trajectory(r) for r in rewards]})
            for rewards in group_rewards
        ]
        path = model_dir / "trajectories" / split / f"{step:04d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines))
    return model_dir


def _assert_shown(base: Path) -> None:
    """What `art show` reads: every step, every group, the sampled turns as trainable."""
    project = read_project(locate(base))
    (model,) = project["models"]
    assert model["name"] == "agent"
    assert model["base_model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert {split: [s["step"] for s in steps] for split, steps in model["splits"].items()} == {
        "train": [0, 1],
        "val": [0],
    }
    step0 = model["splits"]["train"][0]["groups"]
    assert [[t["reward"] for t in g["trajectories"]] for g in step0] == [[1.0, 0.0], [0.5, 0.5]]
    messages = step0[0]["trajectories"][0]["messages"]
    assert [m.get("trainable", False) for m in messages] == [False, False, True, False, True]
    assert messages[2]["calls"] == [
        {"id": "call_7", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    ]
    assert messages[4]["content"] == "It is sunny in Paris."
    assert "It is sunny in Paris." in build_page(base)


def test_an_art_0_4_run_migrated_by_the_function_shows_in_art_show(tmp_path: Path) -> None:
    model_dir = write_art_0_4_run(tmp_path)
    jsonl_bytes = sum(p.stat().st_size for p in model_dir.rglob("*.jsonl"))
    progress: list[str] = []
    result = migrate_model_dir(model_dir, progress_callback=progress.append)
    assert result.errors == []
    assert result.files_migrated == 3
    assert result.bytes_before == jsonl_bytes
    assert result.bytes_after > 0
    assert sorted(Path(p).name for p in progress) == ["0000.jsonl", "0000.jsonl", "0001.jsonl"]
    assert list(model_dir.rglob("*.jsonl")) == []  # deleted once written
    groups = read_trajectory_groups_parquet(model_dir / "trajectories/train/0000.parquet")
    sampled = groups[0].trajectories[0].messages_and_choices[4]
    assert isinstance(sampled, Choice)
    assert sampled.message.content == "It is sunny in Paris."
    _assert_shown(tmp_path)


def test_an_art_0_4_run_migrated_by_the_cli_shows_in_art_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = write_art_0_4_run(tmp_path)
    project_dir = model_dir.parent.parent
    assert main(["migrate", str(project_dir), "--dry-run"]) == 0
    assert "[DRY RUN] Would migrate 3 files" in capsys.readouterr().out
    assert len(list(model_dir.rglob("*.jsonl"))) == 3
    assert not list(model_dir.rglob("*.parquet"))

    assert main(["migrate", str(project_dir), "--keep-jsonl", "-v"]) == 0
    out = capsys.readouterr().out
    assert "Migrating project directory" in out
    assert "Migrated 3 files" in out
    assert "Processing model: agent" in out
    assert len(list(model_dir.rglob("*.jsonl"))) == 3  # kept, as asked
    _assert_shown(tmp_path)
    page = tmp_path / "page.html"
    assert main(["show", str(tmp_path), "--no-open", "--out", str(page)]) == 0
    assert "It is sunny in Paris." in page.read_text()


def test_the_cli_takes_a_model_or_a_trajectories_directory(tmp_path: Path) -> None:
    model_dir = write_art_0_4_run(tmp_path)
    assert main(["migrate", str(model_dir / "trajectories" / "val")]) == 0
    assert (model_dir / "trajectories/val/0000.parquet").exists()
    assert main(["migrate", str(model_dir)]) == 0
    assert list(model_dir.rglob("*.jsonl")) == []
    assert main(["migrate", str(tmp_path / "nowhere")]) == 2
    assert main(["migrate", str(tmp_path)]) == 2  # the base path: not a project or model


def test_a_parquet_twin_is_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = write_art_0_4_run(tmp_path)
    twin = model_dir / "trajectories/train/0001.parquet"
    twin.write_bytes(b"logged by a newer run")
    assert main(["migrate", str(model_dir)]) == 1
    assert "0001.parquet already exists" in capsys.readouterr().err
    assert twin.read_bytes() == b"logged by a newer run"
    assert (model_dir / "trajectories/train/0001.jsonl").exists()
    assert (model_dir / "trajectories/train/0000.parquet").exists()  # the others migrated


def test_a_bad_line_is_named_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "0000.jsonl"
    good = json.dumps({"trajectories": [_art_0_4_trajectory(1.0)]})
    path.write_text(good + "\n" + json.dumps({"trajectories": [{"reward": "high"}]}) + "\n")
    result = migrate_jsonl_to_parquet(path)
    assert result.files_migrated == 0
    assert len(result.errors) == 1
    assert "line 2" in result.errors[0]
    assert "reward" in result.errors[0]
    assert path.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["0000.jsonl"]


def test_other_files_and_missing_ones(tmp_path: Path) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("x")
    assert migrate_jsonl_to_parquet(other) == MigrationResult(files_skipped=1)
    assert migrate_jsonl_to_parquet(tmp_path / "gone.jsonl").errors == [
        f"File not found: {tmp_path / 'gone.jsonl'}"
    ]
    assert migrate_model_dir(tmp_path) == MigrationResult()  # no trajectories/: nothing to do
    assert migrate_all_models(tmp_path, "none").errors == [
        f"Models directory not found: {tmp_path / 'none' / 'models'}"
    ]


def test_migrate_all_models_and_auto_migrate(tmp_path: Path) -> None:
    write_art_0_4_run(tmp_path)
    assert migrate_all_models(tmp_path, "weather", dry_run=True).bytes_after > 0
    result = migrate_all_models(tmp_path, "weather", delete_originals=False)
    assert result.files_migrated == 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = auto_migrate_on_register(tmp_path / "weather/models/agent")
    assert again.files_migrated == 0
    assert len(again.errors) == 3
    assert caught
    assert issubclass(caught[0].category, RuntimeWarning)


def test_migration_result_adds_up() -> None:
    total = MigrationResult(1, 0, 100, 10, ["a"]) + MigrationResult(2, 1, 300, 10, ["b"])
    assert total == MigrationResult(3, 1, 400, 20, ["a", "b"])
    assert total.compression_ratio == 20.0
    assert total.space_saved == 380
    assert MigrationResult().compression_ratio == 0.0


def test_legacy_jsonl_round_trip_and_yaml() -> None:
    group = art.TrajectoryGroup(
        [tool_trajectory(1.0)], exceptions=[ValueError("x")], metadata={"s": 1}, logs=["l"]
    )
    assert deserialize_trajectory_groups(serialize_trajectory_groups([group])) == [group]
    yaml_text = "- trajectories:\n  - reward: 0.5\n    messages_and_choices:\n" + (
        "    - {role: user, content: hi}\n"
    )
    (loaded,) = deserialize_trajectory_groups(yaml_text)
    assert loaded.trajectories[0].reward == 0.5
    assert loaded.trajectories[0].messages_and_choices == [{"role": "user", "content": "hi"}]
