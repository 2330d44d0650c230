"""Read one project's runs from disk into the plain data the page embeds.

Only what a run wrote is read, through `ModelStore`: `model.json`, `history.jsonl` and
the Parquet trajectory logs. Messages are reduced to what a person reads (role, text,
tool calls, whether the turn was sampled); token ids and logprobs, most of a sampled
turn's JSON, stay in the Parquet files.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openai.types.chat.chat_completion import Choice

from ..core.data.errors import ConfigError
from ..core.data.trajectories import History, Trajectory, TrajectoryGroup
from ..core.data.types import MessageOrChoice
from ..core.metrics.history_keys import TRAINING_STEP_KEY
from ..core.metrics.metrics_taxonomy import SFT_METRIC_PREFIX, SFT_WANDB_GRADIENT_STEP_KEY
from ..core.store.model_store import ModelStore, list_models, list_projects

_PATH_FIX = (
    "Pass the directory your backend stores runs in (LocalBackend(path=...), ./.art by "
    "default), which holds <project>/models/<name>/"
)
# Splits listed first in the page, in this order; any others follow alphabetically.
_SPLIT_ORDER = ("train", "val")
# Metrics drawn first within a split, after the rewards of every split.
_LEADING_METRICS = ("reward_std_dev", "exception_rate")
# A row's columns that place it rather than measure something.
_ROW_FIELDS = ("step", "recorded_at", TRAINING_STEP_KEY)
# Where an SFT batch's row lies within its call: its 1-based index and the call's batches.
_SFT_BATCH = SFT_WANDB_GRADIENT_STEP_KEY
_SFT_BATCHES = f"{SFT_METRIC_PREFIX}/batches"


@dataclass(frozen=True)
class RunLocation:
    """Where a project's runs are: the backend's base path and the project's name."""

    base_path: Path
    project: str


def locate(path: str | os.PathLike[str], project: str | None = None) -> RunLocation:
    """Find the project to show under `path`, or raise `ConfigError` naming the path.

    `path` is a backend's base path, or a project's directory, or one model's directory
    inside it. `project` must be given when the base path holds several projects.
    """
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise ConfigError("path", f"{root} is not a directory", _PATH_FIX)
    projects = [name for name in list_projects(root) if list_models(root, name)]
    inside = None if projects else _enclosing_project(root)
    if inside is not None:
        if project is not None and project != inside.project:
            raise ConfigError(
                "project",
                f"{root} is a run of project {inside.project!r}, not {project!r}",
                "Leave --project out, or pass the path that holds that project",
            )
        return inside
    if project is not None:
        if project not in projects:
            known = ", ".join(projects) or "none"
            raise ConfigError(
                "project",
                f"no run of project {project!r} under {root} (projects there: {known})",
                "Name one of those projects, or pass the path the run was written to",
            )
        return RunLocation(root, project)
    if not projects:
        raise ConfigError("path", f"no run under {root}: it holds no <project>/models/", _PATH_FIX)
    if len(projects) > 1:
        raise ConfigError(
            "project",
            f"{root} holds several projects: {', '.join(projects)}",
            "Pick one with --project NAME (project=... in Python)",
        )
    return RunLocation(root, projects[0])


def _enclosing_project(root: Path) -> RunLocation | None:
    """The project `root` is the directory of, or holds a model directory of."""
    if list_models(root.parent, root.name):
        return RunLocation(root.parent, root.name)
    if len(root.parents) > 2 and root.parent.name == "models":
        base, project = root.parents[2], root.parents[1].name
        if list_models(base, project):
            return RunLocation(base, project)
    return None


def _split_key(split: str) -> tuple[int, str]:
    rank = _SPLIT_ORDER.index(split) if split in _SPLIT_ORDER else len(_SPLIT_ORDER)
    return (rank, split)


def metric_order(names: set[str]) -> list[str]:
    """Rewards of every split first, then each split's (or section's: `loss/`, `data/`)
    metrics, the common ones leading."""

    def key(name: str) -> tuple[bool, tuple[int, str], int, str]:
        split, _, metric = name.partition("/")
        metric_rank = (
            _LEADING_METRICS.index(metric) if metric in _LEADING_METRICS else len(_LEADING_METRICS)
        )
        return (metric != "reward", _split_key(split), metric_rank, metric)

    return sorted(names, key=key)


class _Tools:
    """Tool lists stored once per page; trajectories refer to them by index."""

    def __init__(self) -> None:
        self.lists: list[list[dict[str, Any]]] = []
        self._index: dict[str, int] = {}

    def add(self, tools: list[Any] | None) -> int | None:
        if not tools:
            return None
        key = json.dumps(tools, sort_keys=True, default=str)
        if key not in self._index:
            self._index[key] = len(self.lists)
            self.lists.append(json.loads(key))
        return self._index[key]


def _text(content: object) -> str | None:
    """A message's content as text; content parts that are not text are named, not shown."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return json.dumps(content, default=str)


def _call(call: object) -> dict[str, Any]:
    data: dict[str, Any] = call if isinstance(call, dict) else {}
    if not isinstance(call, dict) and hasattr(call, "model_dump"):
        data = call.model_dump()
    function = data.get("function") or data.get("custom") or {}
    arguments = function.get("arguments", function.get("input"))
    return {
        "id": data.get("id"),
        "name": function.get("name"),
        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
    }


def _message(item: MessageOrChoice) -> dict[str, Any]:
    """role and content always; `calls`, `call_id`, `name`, `trainable` (a sampled turn)
    and `finish` only where they apply, which keeps a page of thousands of messages small."""
    if isinstance(item, Choice):
        row: dict[str, Any] = {
            "role": "assistant",
            "content": item.message.content,
            "trainable": True,
            "finish": item.finish_reason,
        }
        calls: list[Any] = list(item.message.tool_calls or [])
    else:
        message: dict[str, Any] = dict(item)
        row = {"role": message.get("role"), "content": _text(message.get("content"))}
        calls = list(message.get("tool_calls") or [])
        for key, field in (("tool_call_id", "call_id"), ("name", "name")):
            if message.get(key) is not None:
                row[field] = message[key]
    if calls:
        row["calls"] = [_call(call) for call in calls]
    return row


def _conversation(item: Trajectory | History, tools: _Tools) -> dict[str, Any]:
    return {
        "messages": [_message(message) for message in item.messages_and_choices],
        "tools": tools.add(item.tools),
    }


def _trajectory(index: int, trajectory: Trajectory, tools: _Tools) -> dict[str, Any]:
    # A captured trajectory shows the conversations of its exchanges, the main one first.
    main, *others = trajectory.histories()
    return {
        "index": index,
        "reward": trajectory.reward,
        "metrics": trajectory.metrics,
        "metadata": trajectory.metadata,
        "logs": trajectory.logs,
        **_conversation(main, tools),
        "histories": [_conversation(history, tools) for history in others],
    }


def _group(index: int, group: TrajectoryGroup, tools: _Tools) -> dict[str, Any]:
    return {
        "index": index,
        "metadata": group.metadata,
        "trajectories": [_trajectory(i, t, tools) for i, t in enumerate(group.trajectories)],
        "exceptions": [record.model_dump() for record in group.exceptions],
    }


def _series(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    points: dict[str, list[list[Any]]] = {}
    for row in history:
        step = row.get("step")
        if not isinstance(step, int):
            continue
        for name, value in row.items():
            if name in _ROW_FIELDS or not isinstance(value, int | float):
                continue
            if name in (_SFT_BATCH, _SFT_BATCHES) and _SFT_BATCHES in row:
                continue  # where the row's point lies, not a curve of its own
            points.setdefault(name, []).append(_point(row, name, step, float(value)))
    return [{"name": name, "points": points[name]} for name in metric_order(set(points))]


def _point(row: dict[str, Any], name: str, step: int, value: float) -> list[Any]:
    """[x, value], or [x, value, label] for a row of one batch of a call that made `step`
    in several optimizer steps (an SFT call's `sft/gradient_step`, from 1, of
    `sft/batches`): its batches are spread between step - 1 and `step`, so they draw as
    a curve."""
    batch, batches = row.get(_SFT_BATCH), row.get(_SFT_BATCHES)
    if not name.startswith(f"{SFT_METRIC_PREFIX}/"):
        return [step, value]
    if not (isinstance(batch, int | float) and isinstance(batches, int | float) and batches > 0):
        return [step, value]
    return [
        step - 1 + batch / batches,
        value,
        f"step {step}, batch {int(batch)} of {int(batches)}",
    ]


def _model(location: RunLocation, name: str, tools: _Tools) -> dict[str, Any]:
    store = ModelStore(location.base_path, location.project, name)
    record = store.read_model() or {}
    splits = {
        split: [
            {
                "step": step,
                "groups": [
                    _group(i, group, tools)
                    for i, group in enumerate(store.read_trajectories(split, step))
                ],
            }
            for step in store.logged_steps(split)
        ]
        for split in sorted(store.logged_splits(), key=_split_key)
    }
    return {
        "name": name,
        "base_model": record.get("base_model"),
        "trainable": bool(record.get("trainable", False)),
        "step": store.step(),
        "metrics": _series(store.read_history()),
        "splits": splits,
    }


def read_project(location: RunLocation) -> dict[str, Any]:
    """Every model of the project: its metric curves and its logged trajectories."""
    tools = _Tools()
    models = [
        _model(location, name, tools) for name in list_models(location.base_path, location.project)
    ]
    return {
        "project": location.project,
        "source": str(location.base_path / location.project),
        "models": models,
        "tools": tools.lists,
    }
