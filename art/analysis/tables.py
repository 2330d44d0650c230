"""A project's logged trajectories as one table, and their per-step aggregates.

`load_trajectories` reads every `trajectories/{split}/{step:04d}.parquet` of a project's
models (through the model store's Parquet reader) into a `pyarrow.Table` with a row per
trajectory and ART's columns:

    model, split, step, reward, group_number, messages, logs   fixed
    metric_<key>          float   one per trajectory metric key (bools as 0/1)
    metadata_<key>        string  one per trajectory metadata key (values as str())
    group_metric_<key>    float   the group's metrics, repeated on each of its rows
    group_metadata_<key>  string  the group's metadata, likewise

`group_number` numbers the groups of the whole table from 1, in the order read (models
and splits by name, steps ascending). Rollouts that raised (a group's `exceptions`) are
not rows: they have no reward or messages.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openai.types.chat.chat_completion import Choice

from ..core.data.errors import ConfigError
from ..core.data.trajectories import Trajectory, TrajectoryGroup
from ..core.data.types import MessageOrChoice
from ..core.store.model_store import ModelStore, list_models, list_projects

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_ART_PATH = "./.art"
"""Where tables are read from when no `art_path` is given: `LocalBackend`'s default path."""

_KEYS = ["model", "split", "step"]


class BenchmarkModelKey:
    """One line of a comparison: a model's `split`, shown as `display_name`.

    `display_name` defaults to `name`, `split` to `"val"`.
    """

    __slots__ = ("display_name", "name", "split")

    def __init__(self, name: str, display_name: str | None = None, split: str | None = None):
        self.name = name
        self.display_name = display_name or name
        self.split = split or "val"

    def __str__(self) -> str:
        return self.display_name

    def __repr__(self) -> str:
        return (
            f"BenchmarkModelKey(name={self.name!r}, display_name={self.display_name!r}, "
            f"split={self.split!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BenchmarkModelKey):
            return NotImplemented
        return (self.name, self.display_name, self.split) == (
            other.name,
            other.display_name,
            other.split,
        )

    def __hash__(self) -> int:
        return hash((self.name, self.display_name, self.split))


# --- reading ------------------------------------------------------------------------------


async def load_trajectories(
    project_name: str,
    models: list[str] | None = None,
    debug: bool = False,
    art_path: str | os.PathLike[str] | None = None,
) -> pa.Table:
    """Every logged trajectory of `project_name`'s models, a row each (see the module doc).

    Args:
        project_name: the project the models were registered in.
        models: the model names to read; None reads every model of the project.
        debug: show progress bars over the files read.
        art_path: the backend's path (default `./.art`, `LocalBackend`'s).

    The files are read in a worker thread, so the event loop keeps running.
    """
    return await asyncio.to_thread(_load_trajectories, project_name, models, debug, art_path)


def _load_trajectories(
    project_name: str,
    models: list[str] | None,
    debug: bool,
    art_path: str | os.PathLike[str] | None,
) -> pa.Table:
    import pyarrow as pa
    from tqdm.auto import tqdm

    base = Path(art_path if art_path is not None else DEFAULT_ART_PATH)
    names = _model_names(base, project_name, models)
    files = [
        (store, name, split, step)
        for name in names
        for store in [ModelStore(base, project_name, name)]
        for split in store.logged_splits()
        for step in store.logged_steps(split)
    ]
    rows: list[dict[str, Any]] = []
    group_numbers: dict[tuple[str, str, int, int], int] = {}
    for store, name, split, step in tqdm(
        files, desc="Loading trajectories", unit="file", disable=not debug
    ):
        for group_index, group in enumerate(store.read_trajectories(split, step)):
            for trajectory in group.trajectories:
                number = group_numbers.setdefault(
                    (name, split, step, group_index), len(group_numbers) + 1
                )
                rows.append(_row(name, split, step, number, group, trajectory))

    fields = _fixed_fields()
    dynamic = sorted({key for row in rows for key in row} - {name for name, _ in fields})
    for prefix, kind in (
        ("metric_", pa.float64()),
        ("metadata_", pa.string()),
        ("group_metric_", pa.float64()),
        ("group_metadata_", pa.string()),
    ):
        fields += [(key, kind) for key in dynamic if _family(key) == prefix]
    return pa.Table.from_pylist(rows, schema=pa.schema(fields))


def _model_names(base: Path, project: str, models: list[str] | None) -> list[str]:
    if project not in list_projects(base):
        raise ConfigError(
            "project_name",
            f"no project {project!r} is stored under {base}",
            "Pass the project the models were registered in, and art_path=<the backend's "
            "path> (LocalBackend's default is ./.art)",
        )
    stored = list_models(base, project)
    if models is None:
        return stored
    unknown = [name for name in models if name not in stored]
    if unknown:
        raise ConfigError(
            "models",
            f"{', '.join(map(repr, unknown))} not stored in project {project!r} under {base}",
            f"Pick from: {', '.join(stored) or '(none)'}",
        )
    return sorted(set(models))


def _family(column: str) -> str:
    for prefix in ("group_metric_", "group_metadata_", "metric_", "metadata_"):
        if column.startswith(prefix):
            return prefix
    return ""


def _fixed_fields() -> list[tuple[str, Any]]:
    import pyarrow as pa

    call = pa.struct([("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("tool_calls", pa.list_(call)),
            ("trainable", pa.bool_()),
        ]
    )
    return [
        ("model", pa.string()),
        ("split", pa.string()),
        ("step", pa.int64()),
        ("reward", pa.float64()),
        ("group_number", pa.int64()),
        ("messages", pa.list_(message)),
        ("logs", pa.list_(pa.string())),
    ]


def _row(
    model: str,
    split: str,
    step: int,
    group_number: int,
    group: TrajectoryGroup,
    trajectory: Trajectory,
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "model": model,
        "split": split,
        "step": step,
        "reward": trajectory.reward,
        "group_number": group_number,
        "messages": [_message(item) for item in trajectory.messages_and_choices],
        "logs": list(trajectory.logs),
    }
    row.update({f"metric_{k}": float(v) for k, v in trajectory.metrics.items()})
    row.update({f"metadata_{k}": str(v) for k, v in trajectory.metadata.items()})
    row.update({f"group_metric_{k}": float(v) for k, v in group.metrics.items()})
    row.update({f"group_metadata_{k}": str(v) for k, v in group.metadata.items()})
    return row


def _message(item: MessageOrChoice) -> dict[str, Any]:
    if isinstance(item, Choice):
        calls = [call.model_dump() for call in item.message.tool_calls or []]
        return {
            "role": "assistant",
            "content": item.message.content,
            "tool_calls": [_call(call) for call in calls] or None,
            "trainable": True,
        }
    message: Mapping[str, Any] = item
    content = message.get("content")
    return {
        "role": message.get("role"),
        "content": content if content is None or isinstance(content, str) else json.dumps(content),
        "tool_calls": [_call(call) for call in message.get("tool_calls") or []] or None,
        "trainable": False,
    }


def _call(call: Mapping[str, Any]) -> dict[str, Any]:
    # A function call has name and arguments; a custom tool call has name and input.
    body = call.get("function") or call.get("custom") or {}
    arguments = body.get("arguments", body.get("input"))
    return {"function": {"name": body.get("name"), "arguments": arguments}}


# --- selecting ----------------------------------------------------------------------------


def as_table(df: object) -> pa.Table:
    """`df` as a `pyarrow.Table`: a table as is, or what its `to_arrow()` returns (polars)."""
    import pyarrow as pa

    if isinstance(df, pa.Table):
        return df
    to_arrow = getattr(df, "to_arrow", None)
    table = to_arrow() if callable(to_arrow) else None
    if not isinstance(table, pa.Table):
        raise ConfigError(
            "df",
            f"expected a pyarrow.Table (what load_trajectories returns), got {type(df).__name__}",
            "Pass load_trajectories' table; a pandas frame converts with pyarrow.Table.from_pandas(df)",
        )
    return table


def require_columns(table: pa.Table, columns: Sequence[str]) -> None:
    """Raise naming `df` if `table` lacks any of `columns`."""
    missing = [name for name in columns if name not in table.column_names]
    if missing:
        raise ConfigError(
            "df",
            f"the table has no column {', '.join(map(repr, missing))} "
            f"(it has {', '.join(table.column_names) or 'none'})",
            "Pass a table from load_trajectories or load_aggregated_trajectories",
        )


def filter_rename_model_split(df: pa.Table, models: list[BenchmarkModelKey]) -> pa.Table:
    """The rows of `df` whose (model, split) is one of `models`, each model renamed to its
    key's `display_name` (the first key naming a (model, split) pair wins)."""
    import pyarrow as pa

    table = as_table(df)
    require_columns(table, ["model", "split"])
    shown: dict[tuple[str, str], str] = {}
    for key in models:
        shown.setdefault((key.name, key.split), key.display_name)
    pairs = zip(table.column("model").to_pylist(), table.column("split").to_pylist(), strict=True)
    names = [shown.get((model, split)) for model, split in pairs]
    table = table.filter(pa.array([name is not None for name in names], pa.bool_()))
    kept = pa.array([name for name in names if name is not None], pa.string())
    return table.set_column(table.column_names.index("model"), "model", kept)


# --- aggregating --------------------------------------------------------------------------


async def load_aggregated_trajectories(
    project_name: str,
    models: list[str] | None = None,
    metrics: list[str] | None = None,
    art_path: str | os.PathLike[str] | None = None,
    include_history: bool = False,
) -> pa.Table:
    """A row per (model, split, step): each metric's mean over the step's groups of its
    mean within the group, sorted by model, split and step.

    Columns: `model`, `split`, `step`, `metric_<key>` for each metric (`metric_reward` is
    the trajectories' `reward` unless a metric of that name was logged),
    `metric_reward_std_dev` (the mean over groups of the reward's sample standard
    deviation within the group), and with `include_history` `recorded_at` (the time of the
    first `history.jsonl` row of that model and step, as logged; null where there is none).

    Args:
        metrics: the metric keys to keep (without `metric_`); None keeps all. A key that
            no trajectory logged is an error.
        Others as in `load_trajectories`.
    """
    import pyarrow as pa

    table = await load_trajectories(project_name, models=models, art_path=art_path)
    if table.num_rows == 0:
        return table
    if "metric_reward" not in table.column_names:
        table = table.append_column("metric_reward", table.column("reward"))
    logged = [name for name in table.column_names if name.startswith("metric_")]
    if metrics is not None:
        missing = [m for m in metrics if f"metric_{m}" not in logged]
        if missing:
            raise ConfigError(
                "metrics",
                f"no trajectory logged {', '.join(map(repr, missing))}",
                f"Pick from: {', '.join(name.removeprefix('metric_') for name in logged)}",
            )
        logged = [name for name in logged if name.removeprefix("metric_") in metrics]

    group_keys = [*_KEYS, "group_number"]
    per_group = _mean_by(table, group_keys, logged)
    steps = _mean_by(per_group, _KEYS, logged)
    if "metric_reward" in logged:
        spread = table.group_by(group_keys, use_threads=False).aggregate(
            [("metric_reward", "stddev", _sample())]
        )
        spread = spread.rename_columns(
            ["metric_reward_std_dev" if n.startswith("metric_") else n for n in spread.column_names]
        )
        steps = steps.join(_mean_by(spread, _KEYS, ["metric_reward_std_dev"]), keys=_KEYS)
    if include_history:
        base = Path(art_path if art_path is not None else DEFAULT_ART_PATH)
        names = sorted(set(table.column("model").to_pylist()))
        stamps = pa.Table.from_pylist(
            _first_recorded_at(base, project_name, names),
            schema=pa.schema(
                [("model", pa.string()), ("step", pa.int64()), ("recorded_at", pa.string())]
            ),
        )
        steps = steps.join(stamps, keys=["model", "step"])
    ordered = [*_KEYS, *logged]
    ordered += [n for n in ("metric_reward_std_dev", "recorded_at") if n in steps.column_names]
    return steps.select(ordered).sort_by([(key, "ascending") for key in _KEYS])


def _mean_by(table: pa.Table, keys: list[str], columns: list[str]) -> pa.Table:
    grouped = table.group_by(keys, use_threads=False).aggregate([(c, "mean") for c in columns])
    means = {f"{c}_mean": c for c in columns}
    return grouped.rename_columns([means.get(n, n) for n in grouped.column_names])


def _sample() -> Any:
    import pyarrow.compute as pc

    return pc.VarianceOptions(ddof=1)  # a group of one has no spread: null, left out


def _first_recorded_at(base: Path, project: str, models: list[str]) -> list[dict[str, Any]]:
    stamps: list[dict[str, Any]] = []
    for name in models:
        seen: set[int] = set()
        for row in ModelStore(base, project, name).read_history():
            step, at = row.get("step"), row.get("recorded_at")
            if isinstance(step, int) and isinstance(at, str) and step not in seen:
                seen.add(step)
                stamps.append({"model": name, "step": step, "recorded_at": at})
    return stamps


async def load_latest_metrics(
    project_name: str,
    models: list[str] | None = None,
    split: str = "val",
    metrics: list[str] | None = None,
    art_path: str | os.PathLike[str] | None = None,
) -> pa.Table:
    """A row per model with its aggregated metrics (`load_aggregated_trajectories`) at its
    latest step of `split`, sorted by model: columns `model`, `step`, `metric_*`.

    A `split` that no model logged is an error; a project with no trajectories gives an
    empty table.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    steps = await load_aggregated_trajectories(
        project_name, models=models, metrics=metrics, art_path=art_path
    )
    if steps.num_rows == 0:
        return steps
    splits = sorted(set(steps.column("split").to_pylist()))
    if split not in splits:
        raise ConfigError(
            "split",
            f"no model of project {project_name!r} logged the split {split!r}",
            f"Pick from: {', '.join(splits)}",
        )
    columns = ["model", "step", *(n for n in steps.column_names if n.startswith("metric_"))]
    latest: dict[str, dict[str, Any]] = {}
    for row in steps.filter(pc.equal(steps.column("split"), split)).to_pylist():
        if row["model"] not in latest or row["step"] > latest[row["model"]]["step"]:
            latest[row["model"]] = row
    rows = [{c: latest[model][c] for c in columns} for model in sorted(latest)]
    return pa.Table.from_pylist(rows, schema=steps.select(columns).schema)


__all__ = [
    "DEFAULT_ART_PATH",
    "BenchmarkModelKey",
    "as_table",
    "filter_rename_model_split",
    "load_aggregated_trajectories",
    "load_latest_metrics",
    "load_trajectories",
    "require_columns",
]
