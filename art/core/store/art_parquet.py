"""Reading the trajectory Parquet files OpenPipe ART writes, into our groups.

ART has written two layouts, and ours (`parquet.py`) is a third:

- ART 0.5.18 (v1): a row per trajectory with readable columns only (`group_index`,
  `group_metadata`, `group_metrics`, `group_logs`, `reward`, `metrics`, `metadata`,
  `tools`, `logs`, `messages`). Sampled turns were flattened to plain messages, so
  their token ids and logprobs are gone; they come back as assistant messages.
- ART 0.5.23 (v2): the v1 columns plus `format_version`, `trajectory_index`,
  `group_json` and `trajectory_json` (the full models as JSON), and the schema
  metadata key `art.trajectory_parquet.version`. It reads back exactly, captured
  `exchanges` included (each exchange's computed `model` key is computed again).

`parquet.read_groups` sends any file without our `trajectory` column here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..data.errors import TrajectoryValidationError
from ..data.trajectories import PydanticException, Trajectory, TrajectoryGroup

ART_VERSION_KEY = b"art.trajectory_parquet.version"
ART_FORMAT_VERSION = 2
_GROUP_FIELDS = {"exceptions", "metadata", "metrics", "logs"}
_FIX = "Write the file with art.utils.trajectory_logging.write_trajectory_groups_parquet"


def _bad(path: Path, field: str, problem: str) -> TrajectoryValidationError:
    return TrajectoryValidationError(f"{path}: {field}", problem, _FIX)


def read_art_groups(path: Path) -> list[TrajectoryGroup]:
    """The groups of an ART 0.5.18 (v1) or ART 0.5.23 (v2) trajectory Parquet file."""
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    raw_version = (schema.metadata or {}).get(ART_VERSION_KEY)
    if raw_version is not None and raw_version != str(ART_FORMAT_VERSION).encode():
        raise _bad(
            path,
            "metadata",
            f"ART trajectory format {raw_version.decode(errors='replace')!r} is not one "
            f"this version reads (it reads {ART_FORMAT_VERSION} and the unversioned files "
            "of ART 0.5.18)",
        )
    rows = pq.read_table(path).to_pylist()
    if "format_version" in schema.names:
        return _read_v2(path, rows)
    if {"group_json", "trajectory_json"} & set(schema.names):
        raise _bad(path, "format_version", "the column is missing beside group_json")
    return _read_v1(path, rows)


def _json_object(path: Path, field: str, payload: object) -> dict[str, Any]:
    if not isinstance(payload, str):
        raise _bad(path, field, f"expected JSON text, got {type(payload).__name__}")
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as error:
        raise _bad(path, field, f"not JSON ({error})") from error
    if not isinstance(value, dict):
        raise _bad(path, field, f"expected a JSON object, got {type(value).__name__}")
    return value


def _index(path: Path, field: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _bad(path, field, f"expected an integer, got {value!r}")
    return value


def _v2_trajectory(path: Path, payload: object) -> Trajectory:
    data = _json_object(path, "trajectory_json", payload)
    exchanges = data.get("exchanges")
    if isinstance(exchanges, Mapping) and not any(exchanges.values()):
        del data["exchanges"]  # ART dumps its empty lists with every trajectory
    if "exchanges" in data:
        # ART writes a captured trajectory's empty hand-built fields: not a second shape.
        for name, empty in (("messages_and_choices", []), ("tools", None)):
            if data.get(name) == empty:
                data.pop(name)
        if data.get("additional_histories") == []:
            data.pop("additional_histories")
    try:
        return Trajectory.model_validate(data)
    except ValidationError as error:
        raise _bad(path, "trajectory_json", f"not a trajectory ({error})") from error


def _v2_group(path: Path, index: int, rows: list[dict[str, Any]]) -> TrajectoryGroup:
    payloads = {row.get("group_json") for row in rows}
    if len(payloads) != 1:
        raise _bad(path, "group_json", f"group {index} has rows that disagree")
    data = _json_object(path, "group_json", payloads.pop())
    unknown = set(data) - _GROUP_FIELDS
    if unknown:
        raise _bad(path, "group_json", f"unknown group fields {sorted(unknown)}")
    trajectories: dict[int, Trajectory] = {}
    for row in rows:
        if row.get("trajectory_index") is None:
            continue  # the one row of a group without trajectories
        position = _index(path, "trajectory_index", row["trajectory_index"])
        if position in trajectories:
            raise _bad(path, "trajectory_index", f"group {index} repeats {position}")
        trajectories[position] = _v2_trajectory(path, row.get("trajectory_json"))
    if sorted(trajectories) != list(range(len(trajectories))):
        raise _bad(path, "trajectory_index", f"group {index} misses a trajectory")
    return TrajectoryGroup(
        [trajectories[i] for i in range(len(trajectories))],
        exceptions=[PydanticException.model_validate(e) for e in data.get("exceptions", [])],
        metadata=data.get("metadata") or {},
        metrics=data.get("metrics") or {},
        logs=data.get("logs") or [],
    )


def _read_v2(path: Path, rows: list[dict[str, Any]]) -> list[TrajectoryGroup]:
    by_group: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("format_version") != ART_FORMAT_VERSION:
            raise _bad(path, "format_version", f"unsupported {row.get('format_version')!r}")
        by_group.setdefault(_index(path, "group_index", row.get("group_index")), []).append(row)
    if sorted(by_group) != list(range(len(by_group))):
        raise _bad(path, "group_index", "group indexes are not 0, 1, 2, ...")
    return [_v2_group(path, index, by_group[index]) for index in range(len(by_group))]


def _loose_object(payload: object) -> dict[str, Any]:
    """A v1 JSON column: ART wrote null for an empty dict."""
    if isinstance(payload, str) and payload:
        value = json.loads(payload)
        return value if isinstance(value, dict) else {}
    return {}


def _v1_message(path: Path, flat: object) -> dict[str, Any]:
    if not isinstance(flat, Mapping):
        raise _bad(path, "messages", f"expected a struct, got {type(flat).__name__}")
    message: dict[str, Any] = {"role": flat.get("role"), "content": flat.get("content")}
    if flat.get("tool_calls"):
        message["tool_calls"] = json.loads(str(flat["tool_calls"]))
    if flat.get("tool_call_id"):
        message["tool_call_id"] = flat["tool_call_id"]
    return message


def _read_v1(path: Path, rows: list[dict[str, Any]]) -> list[TrajectoryGroup]:
    groups: dict[int, dict[str, Any]] = {}
    for row in rows:
        index = _index(path, "group_index", row.get("group_index", 0))
        parts = groups.setdefault(
            index,
            {
                "trajectories": [],
                "metadata": _loose_object(row.get("group_metadata")),
                "metrics": _loose_object(row.get("group_metrics")),
                "logs": list(row.get("group_logs") or []),
            },
        )
        if row.get("reward") is None and row.get("messages") is None:
            continue  # a row that carries no trajectory
        tools = row.get("tools")
        parts["trajectories"].append(
            Trajectory(
                messages_and_choices=[_v1_message(path, m) for m in row.get("messages") or []],
                tools=json.loads(tools) if tools else None,
                reward=row.get("reward"),
                metrics=_loose_object(row.get("metrics")),
                metadata=_loose_object(row.get("metadata")),
                logs=list(row.get("logs") or []),
            )
        )
    return [
        TrajectoryGroup(
            parts["trajectories"],
            metadata=parts["metadata"],
            metrics=parts["metrics"],
            logs=parts["logs"],
        )
        for _, parts in sorted(groups.items())
    ]


__all__ = ["ART_FORMAT_VERSION", "ART_VERSION_KEY", "read_art_groups"]
