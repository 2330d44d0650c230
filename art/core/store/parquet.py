"""Trajectory groups as Parquet: a row per trajectory, and a row per recorded exception.

The readable columns (`reward`, `messages` with role, content, tool calls and whether
the turn was trainable) are for analysis with pandas, polars or DuckDB. The
`trajectory` column holds the trajectory's full JSON, which is what `read_groups`
rebuilds from, so nothing is lost in a round trip (a captured trajectory's exchanges
included, as JSON; its readable `messages` are its main conversation's). A group's own `metrics` (JSON) and
`logs` are repeated on each of its rows, as ART's `group_metrics` and `group_logs`.

`read_groups` also reads the files OpenPipe ART writes (0.5.18's and 0.5.23's layouts,
which have no `trajectory` column): see `art_parquet.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from openai.types.chat.chat_completion import Choice

from ..data.errors import TrajectoryValidationError
from ..data.trajectories import PydanticException, Trajectory, TrajectoryGroup
from ..data.types import MessageOrChoice
from .atomic import atomic_path

FORMAT_VERSION = 2  # 2: group_metrics and group_logs columns (files of 1 read as empty)


def _schema() -> Any:
    import pyarrow as pa

    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("tool_calls", pa.string()),
            ("tool_call_id", pa.string()),
            ("trainable", pa.bool_()),
        ]
    )
    return pa.schema(
        [
            ("split", pa.string()),
            ("step", pa.int64()),
            ("group_index", pa.int64()),
            ("trajectory_index", pa.int64()),
            ("group_metadata", pa.string()),
            ("group_metrics", pa.string()),
            ("group_logs", pa.list_(pa.string())),
            ("reward", pa.float64()),
            ("metrics", pa.string()),
            ("metadata", pa.string()),
            ("messages", pa.list_(message)),
            ("tools", pa.string()),
            ("logs", pa.list_(pa.string())),
            ("trajectory", pa.string()),
            ("exception_type", pa.string()),
            ("exception_message", pa.string()),
            ("exception_traceback", pa.string()),
        ],
        metadata={"art_format_version": str(FORMAT_VERSION)},
    )


def _content_text(content: object) -> str | None:
    if content is None or isinstance(content, str):
        return content
    return json.dumps(content)  # a list of content parts


def _message_row(item: MessageOrChoice) -> dict[str, Any]:
    if isinstance(item, Choice):
        calls = item.message.tool_calls
        return {
            "role": "assistant",
            "content": item.message.content,
            "tool_calls": json.dumps([call.model_dump() for call in calls]) if calls else None,
            "tool_call_id": None,
            "trainable": True,
        }
    message: dict[str, Any] = dict(item)
    calls = message.get("tool_calls")
    return {
        "role": message.get("role"),
        "content": _content_text(message.get("content")),
        "tool_calls": json.dumps(list(calls), default=str) if calls else None,
        "tool_call_id": message.get("tool_call_id"),
        "trainable": False,
    }


def _empty_row(
    split: str | None, step: int | None, group_index: int, group: TrajectoryGroup
) -> dict[str, Any]:
    return {
        "split": split,
        "step": step,
        "group_index": group_index,
        "trajectory_index": None,
        "group_metadata": json.dumps(group.metadata),
        "group_metrics": json.dumps(group.metrics),
        "group_logs": list(group.logs),
        "reward": None,
        "metrics": None,
        "metadata": None,
        "messages": None,
        "tools": None,
        "logs": None,
        "trajectory": None,
        "exception_type": None,
        "exception_message": None,
        "exception_traceback": None,
    }


def _trajectory_row(trajectory: Trajectory) -> dict[str, Any]:
    # A captured trajectory's readable columns show its main conversation; its exchanges
    # are kept whole in the `trajectory` column's JSON.
    main = trajectory.histories()[0] if trajectory.exchanges else trajectory
    return {
        "reward": trajectory.reward,
        "metrics": json.dumps(trajectory.metrics),
        "metadata": json.dumps(trajectory.metadata),
        "messages": [_message_row(item) for item in main.messages_and_choices],
        "tools": json.dumps(main.tools) if main.tools is not None else None,
        "logs": list(trajectory.logs),
        "trajectory": trajectory.model_dump_json(),
    }


def write_groups(
    path: Path, groups: list[TrajectoryGroup], *, split: str | None, step: int | None
) -> None:
    """Write `groups` to `path` (overwriting it); `split` and `step` are null in a file
    written outside a model's directory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for group_index, group in enumerate(groups):
        for trajectory_index, trajectory in enumerate(group.trajectories):
            row = _empty_row(split, step, group_index, group)
            row["trajectory_index"] = trajectory_index
            row.update(_trajectory_row(trajectory))
            rows.append(row)
        for record in group.exceptions:
            row = _empty_row(split, step, group_index, group)
            row["exception_type"] = record.type
            row["exception_message"] = record.message
            row["exception_traceback"] = record.traceback
            rows.append(row)
        if not group.trajectories and not group.exceptions:
            rows.append(_empty_row(split, step, group_index, group))
    table = pa.Table.from_pylist(rows, schema=_schema())
    pq.write_table(table, path, compression="zstd")


def read_groups(path: Path) -> list[TrajectoryGroup]:
    """Rebuild the groups written by `write_groups`, exactly (or those of ART's file)."""
    import pyarrow.parquet as pq

    present = set(pq.read_schema(path).names)
    if "trajectory" not in present:
        from .art_parquet import read_art_groups

        return read_art_groups(path)
    columns = ["group_index", "group_metadata", "trajectory", "exception_type"]
    columns += ["exception_message", "exception_traceback"]
    columns += [name for name in ("group_metrics", "group_logs") if name in present]
    rows = pq.read_table(path, columns=columns).to_pylist()
    by_index: dict[int, dict[str, Any]] = {}
    for row in rows:
        parts = by_index.setdefault(
            row["group_index"],
            {
                "metadata": json.loads(row["group_metadata"]),
                "metrics": json.loads(row.get("group_metrics") or "{}"),
                "logs": row.get("group_logs") or [],
                "trajectories": [],
                "exceptions": [],
            },
        )
        if row["trajectory"] is not None:
            parts["trajectories"].append(Trajectory.model_validate_json(row["trajectory"]))
        elif row["exception_type"] is not None:
            parts["exceptions"].append(
                PydanticException(
                    type=row["exception_type"],
                    message=row["exception_message"],
                    traceback=row["exception_traceback"],
                )
            )
    return [
        TrajectoryGroup(
            parts["trajectories"],
            exceptions=parts["exceptions"],
            metadata=parts["metadata"],
            metrics=parts["metrics"],
            logs=parts["logs"],
        )
        for _, parts in sorted(by_index.items())
    ]


def write_trajectory_groups_parquet(
    trajectory_groups: list[TrajectoryGroup], path: str | os.PathLike[str]
) -> None:
    """ART's writer: `trajectory_groups` to a Zstd Parquet file at `path`, atomically.

    The file has our layout (`split` and `step` null), which ART's own reader opens as
    its 0.5.18 layout (readable columns) and `read_trajectory_groups_parquet` exactly.
    """
    for index, group in enumerate(trajectory_groups):
        if not isinstance(group, TrajectoryGroup):
            raise TrajectoryValidationError(
                f"trajectory_groups[{index}]",
                f"expected a TrajectoryGroup, got {type(group).__name__}",
                "Pass the groups `art.gather_trajectory_groups` returned",
            )
    with atomic_path(Path(path)) as tmp:
        write_groups(tmp, list(trajectory_groups), split=None, step=None)


def read_trajectory_groups_parquet(path: str | os.PathLike[str]) -> list[TrajectoryGroup]:
    """ART's reader: the groups of a file of ours, or of ART 0.5.18 or 0.5.23, at `path`."""
    return read_groups(Path(path))
