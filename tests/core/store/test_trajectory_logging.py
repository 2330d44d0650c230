"""`art.utils.trajectory_logging`: ART's Parquet functions, on our files and on ART's.

The ART files here are written column by column in the layouts read from ART's wheels:
0.5.18's readable columns only, and 0.5.23's `format_version` / `group_json` /
`trajectory_json` columns with the `art.trajectory_parquet.version` schema key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import WEATHER_TOOL, sampled_choice, tool_trajectory
from openai.types.chat.chat_completion import Choice

import art
from art.core.store.model_store import ModelStore
from art.utils.trajectory_logging import (
    read_trajectory_groups_parquet,
    write_trajectory_groups_parquet,
)

_MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("tool_calls", pa.string()),
        ("tool_call_id", pa.string()),
        ("trainable", pa.bool_()),
    ]
)
_V1_COLUMNS = [
    ("group_index", pa.int64()),
    ("group_metadata", pa.string()),
    ("group_metrics", pa.string()),
    ("group_logs", pa.list_(pa.string())),
    ("reward", pa.float64()),
    ("metrics", pa.string()),
    ("metadata", pa.string()),
    ("tools", pa.string()),
    ("logs", pa.list_(pa.string())),
    ("messages", pa.list_(_MESSAGE)),
]


def groups() -> list[art.TrajectoryGroup]:
    first = art.TrajectoryGroup(
        [tool_trajectory(1.0), tool_trajectory(0.0, city="Oslo")],
        exceptions=[RuntimeError("weather service down")],
        metadata={"scenario": "weather", "seed": 7},
        metrics={"difficulty": 2},
        logs=["judged by RULER"],
    )
    return [first, art.TrajectoryGroup([], metadata={"scenario": "empty"})]


def test_write_then_read_gives_back_every_field(tmp_path: Path) -> None:
    path = tmp_path / "step.parquet"
    written = groups()
    write_trajectory_groups_parquet(written, path)
    read = read_trajectory_groups_parquet(str(path))
    assert read == written
    choice = read[0].trajectories[0].messages_and_choices[2]
    assert isinstance(choice, Choice)  # a sampled turn stays trainable, logprobs and all
    assert choice.logprobs is not None
    assert choice.logprobs.content
    assert read[0].exceptions[0].message == "weather service down"
    assert read[1].trajectories == []
    assert read[1].metadata == {"scenario": "empty"}
    assert [p.name for p in tmp_path.iterdir()] == ["step.parquet"]  # no temporary left

    write_trajectory_groups_parquet([], path)
    assert read_trajectory_groups_parquet(path) == []


def test_the_readable_columns_are_art_s(tmp_path: Path) -> None:
    """What ART's 0.5.18 reader (and pandas/DuckDB users) query is there, same types."""
    path = tmp_path / "step.parquet"
    write_trajectory_groups_parquet(groups(), path)
    schema = pq.read_schema(path)
    for name, kind in _V1_COLUMNS:
        assert schema.field(name).type == kind, name
    rows = pq.read_table(path).to_pylist()
    assert rows[0]["split"] is None
    assert rows[0]["step"] is None
    assert [m["trainable"] for m in rows[0]["messages"]] == [False, False, True, False, True]
    assert json.loads(rows[0]["tools"]) == [WEATHER_TOOL]


def test_reads_the_files_a_backend_logged(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "proj", "agent")
    logged = groups()[:1]  # a backend logs no empty group
    path = store.write_trajectories("val", 3, logged)
    assert path == tmp_path / "proj/models/agent/trajectories/val/0003.parquet"
    assert read_trajectory_groups_parquet(path) == logged


def test_a_list_of_something_else_is_refused(tmp_path: Path) -> None:
    with pytest.raises(art.TrajectoryValidationError, match=r"trajectory_groups\[0\]"):
        write_trajectory_groups_parquet([tool_trajectory(1.0)], tmp_path / "x.parquet")  # type: ignore[list-item]
    assert not (tmp_path / "x.parquet").exists()


# --- ART 0.5.23's layout (v2) ---------------------------------------------------------


def _art_v2_rows(group_list: list[art.TrajectoryGroup]) -> list[dict[str, Any]]:
    rows = []
    for group_index, group in enumerate(group_list):
        group_json = group.model_dump(mode="json", exclude={"trajectories"})
        common = {"format_version": 2, "group_index": group_index}
        common["group_json"] = json.dumps(group_json)
        if not group.trajectories:
            rows.append({**common, "trajectory_index": None, "trajectory_json": None})
        for index, trajectory in enumerate(group.trajectories):
            data = trajectory.model_dump(mode="json")
            # ART 0.5.23 dumps its (here empty) captured exchanges with every trajectory.
            data["exchanges"] = {"chat_completions": [], "completions": [], "responses": []}
            rows.append(
                {
                    **common,
                    "trajectory_index": index,
                    "trajectory_json": json.dumps(data),
                    "reward": trajectory.reward,
                }
            )
    return rows


def _write_art_v2(path: Path, rows: list[dict[str, Any]], version: bytes = b"2") -> None:
    schema = pa.schema(
        [
            ("format_version", pa.int16()),
            ("group_index", pa.int64()),
            ("trajectory_index", pa.int64()),
            ("group_json", pa.large_string()),
            ("trajectory_json", pa.large_string()),
            *_V1_COLUMNS[1:],
        ],
        metadata={b"art.trajectory_parquet.version": version},
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, compression="zstd")


def test_reads_art_0_5_23_files_exactly(tmp_path: Path) -> None:
    path = tmp_path / "0000.parquet"
    _write_art_v2(path, _art_v2_rows(groups()))
    assert read_trajectory_groups_parquet(path) == groups()


def test_an_art_0_5_23_file_in_a_model_directory_is_read_by_the_store(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "proj", "agent")
    store.trajectories_path("train", 0).parent.mkdir(parents=True)
    _write_art_v2(store.trajectories_path("train", 0), _art_v2_rows(groups()))
    assert store.read_trajectories("train", 0) == groups()
    store.write_trajectories("train", 0, [art.TrajectoryGroup([tool_trajectory(0.5)])])
    assert len(store.read_trajectories("train", 0)) == 3  # appended, ART's groups kept


def test_an_art_0_5_23_exchange_that_is_not_one_is_named(tmp_path: Path) -> None:
    rows = _art_v2_rows(groups())
    data = json.loads(rows[0]["trajectory_json"])
    data["exchanges"]["chat_completions"] = [{"request": {}, "response": {}}]
    rows[0]["trajectory_json"] = json.dumps(data)
    path = tmp_path / "0000.parquet"
    _write_art_v2(path, rows)
    with pytest.raises(art.TrajectoryValidationError, match="exchanges"):
        read_trajectory_groups_parquet(path)


def test_an_unknown_art_format_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "0000.parquet"
    _write_art_v2(path, _art_v2_rows(groups()), version=b"3")
    with pytest.raises(art.TrajectoryValidationError, match="'3' is not one this version reads"):
        read_trajectory_groups_parquet(path)


def test_a_missing_art_trajectory_is_named(tmp_path: Path) -> None:
    rows = _art_v2_rows(groups())
    del rows[0]  # the group's first trajectory
    path = tmp_path / "0000.parquet"
    _write_art_v2(path, rows)
    with pytest.raises(art.TrajectoryValidationError, match="group 0 misses a trajectory"):
        read_trajectory_groups_parquet(path)


# --- ART 0.5.18's layout (v1) ---------------------------------------------------------


def test_reads_art_0_5_18_files_with_sampled_turns_as_messages(tmp_path: Path) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    rows = [
        {
            "group_index": 0,
            "group_metadata": json.dumps({"scenario": "weather"}),
            "group_metrics": None,  # ART 0.5.18 wrote null for an empty dict
            "group_logs": ["g"],
            "reward": 1.0,
            "metrics": json.dumps({"turns": 2}),
            "metadata": None,
            "tools": json.dumps([WEATHER_TOOL]),
            "logs": None,
            "messages": [
                {"role": "user", "content": "Weather?", "trainable": False},
                {"role": "assistant", "tool_calls": json.dumps([call]), "trainable": True},
                {"role": "tool", "content": "sunny", "tool_call_id": "c1", "trainable": False},
            ],
        },
        {"group_index": 1, "reward": 0.25, "messages": []},
    ]
    path = tmp_path / "0000.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema(_V1_COLUMNS)), path)
    first, second = read_trajectory_groups_parquet(path)
    assert first.metadata == {"scenario": "weather"}
    assert first.metrics == {}
    assert first.logs == ["g"]
    trajectory = first.trajectories[0]
    assert trajectory.messages_and_choices == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    assert trajectory.tools == [WEATHER_TOOL]
    assert trajectory.metrics == {"turns": 2}
    assert second.trajectories[0].reward == 0.25


def test_sampled_choice_helper_is_what_the_endpoint_returns() -> None:
    # The fixtures above rest on it: a Choice with per-token logprobs.
    choice = sampled_choice("It is sunny.")
    assert choice.logprobs is not None
    assert len(choice.logprobs.content or []) == 3
