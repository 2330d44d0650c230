"""ART's older trajectory logs (JSONL, one group per line) and their move to Parquet.

Older ART (0.4.x, early 0.5.x) wrote each logged step to
`trajectories/{split}/{step:04d}.jsonl`; ART 0.4.0 wrote `{"trajectories": [...]}` per
group, its sampled choices without their logprobs. Older runs still wrote YAML. The migration rewrites each `.jsonl` file as the `.parquet` file
of the same name, which our `ModelStore`, `art show` and ART's Parquet reader all read,
then deletes the JSONL file unless asked to keep it.

A file that cannot be migrated is left as it was, and named in `MigrationResult.errors`;
so is a `.jsonl` file whose `.parquet` twin already exists (never overwritten).
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
from openai.types.chat.chat_completion import Choice

from ..data.errors import ArtError
from ..data.trajectories import History, Trajectory, TrajectoryGroup
from ..data.types import MessageOrChoice
from .atomic import atomic_path

_STEP_FILE = re.compile(r"^\d{4,}$")
# What a dry run reports as the size after migration: ART's estimate of ~25x smaller.
_DRY_RUN_RATIO = 25

# --- ART's JSONL (de)serialization -----------------------------------------------------


def message_or_choice_to_dict(message_or_choice: MessageOrChoice) -> dict[str, Any]:
    """A message as a plain dict, or a `Choice` as its `to_dict()` (logprobs included)."""
    if isinstance(message_or_choice, Choice):
        return message_or_choice.to_dict()
    item: dict[str, Any] = dict(message_or_choice)
    content = item.get("content")
    if isinstance(content, Iterator):  # pydantic's validation of content parts leaves one
        item["content"] = list(content)
    return item


def history_to_dict(history: History) -> dict[str, Any]:
    return {
        "messages_and_choices": [
            message_or_choice_to_dict(m) for m in history.messages_and_choices
        ],
        "tools": history.tools,
    }


def trajectory_to_dict(trajectory: Trajectory) -> dict[str, Any]:
    data = trajectory.model_dump(
        mode="json", exclude={"messages_and_choices", "additional_histories"}
    )
    data["messages_and_choices"] = [
        message_or_choice_to_dict(m) for m in trajectory.messages_and_choices
    ]
    data["additional_histories"] = [history_to_dict(h) for h in trajectory.additional_histories]
    return data


def trajectory_group_to_dict(trajectory_group: TrajectoryGroup) -> dict[str, Any]:
    return {
        "trajectories": [trajectory_to_dict(t) for t in trajectory_group.trajectories],
        **trajectory_group.model_dump(mode="json", exclude={"trajectories"}),
    }


def serialize_trajectory_groups(trajectory_groups: list[TrajectoryGroup]) -> str:
    """The groups as JSONL text, one group per line (ART's legacy log format)."""
    return "\n".join(json.dumps(trajectory_group_to_dict(g)) for g in trajectory_groups)


def dict_to_message_or_choice(d: dict[str, Any]) -> MessageOrChoice:
    """A `Choice` where `d` holds one (`message`, `finish_reason`, ...), else `d` itself."""
    if "message" in d:
        try:
            return Choice.model_validate(d)
        except pydantic.ValidationError:
            pass  # not a choice after all: a message that has a "message" key
    return d  # type: ignore[return-value]


def dict_to_history(d: dict[str, Any]) -> History:
    return History.model_validate(
        {
            **d,
            "messages_and_choices": [
                dict_to_message_or_choice(m) for m in d.get("messages_and_choices", [])
            ],
        }
    )


def dict_to_trajectory(d: dict[str, Any]) -> Trajectory:
    return Trajectory.model_validate(
        {
            **d,
            "messages_and_choices": [
                dict_to_message_or_choice(m) for m in d.get("messages_and_choices", [])
            ],
            "additional_histories": [
                dict_to_history(h) for h in d.get("additional_histories") or []
            ],
        }
    )


def dict_to_trajectory_group(d: dict[str, Any]) -> TrajectoryGroup:
    rest = {key: value for key, value in d.items() if key != "trajectories"}
    unknown = set(rest) - {"exceptions", "metadata", "metrics", "logs"}
    if unknown:
        raise ValueError(f"unknown trajectory group fields {sorted(unknown)}")
    return TrajectoryGroup(
        [dict_to_trajectory(t) for t in d["trajectories"]],
        exceptions=rest.get("exceptions") or [],
        metadata=rest.get("metadata"),
        metrics=rest.get("metrics"),
        logs=rest.get("logs"),
    )


def deserialize_trajectory_groups(serialized: str) -> list[TrajectoryGroup]:
    """Groups from JSONL text, or from the YAML list ART wrote before JSONL."""
    try:
        loaded = [json.loads(line) for line in serialized.strip().split("\n") if line]
    except json.JSONDecodeError as error:
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError:
            raise ValueError(
                f"not JSONL ({error}); logs in ART's older YAML format need PyYAML: "
                "pip install pyyaml"
            ) from error
        loaded = yaml.safe_load(serialized) or []
    return [dict_to_trajectory_group(group) for group in loaded]


# --- the migration ---------------------------------------------------------------------


@dataclass
class MigrationResult:
    """What a migration did: files migrated and skipped, sizes, and errors (one per file)."""

    files_migrated: int = 0
    files_skipped: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def compression_ratio(self) -> float:
        """bytes_before / bytes_after (0.0 when nothing was written)."""
        return self.bytes_before / self.bytes_after if self.bytes_after else 0.0

    @property
    def space_saved(self) -> int:
        return self.bytes_before - self.bytes_after

    def __add__(self, other: MigrationResult) -> MigrationResult:
        return MigrationResult(
            files_migrated=self.files_migrated + other.files_migrated,
            files_skipped=self.files_skipped + other.files_skipped,
            bytes_before=self.bytes_before + other.bytes_before,
            bytes_after=self.bytes_after + other.bytes_after,
            errors=self.errors + other.errors,
        )


def _split_and_step(jsonl_path: Path) -> tuple[str | None, int | None]:
    """A model's `trajectories/{split}/{step:04d}.jsonl` gives the Parquet columns' values."""
    if _STEP_FILE.match(jsonl_path.stem) and jsonl_path.parent.parent.name == "trajectories":
        return jsonl_path.parent.name, int(jsonl_path.stem)
    return None, None


def _read_jsonl_groups(jsonl_path: Path) -> list[TrajectoryGroup]:
    groups = []
    with open(jsonl_path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                groups.append(dict_to_trajectory_group(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
                raise ValueError(f"line {number}: {error}") from error
    return groups


def migrate_jsonl_to_parquet(
    jsonl_path: Path | str, delete_original: bool = True, dry_run: bool = False
) -> MigrationResult:
    """Rewrite one `.jsonl` trajectory log as the `.parquet` file beside it.

    A file not ending in `.jsonl` is counted as skipped. With `dry_run` nothing is written
    and `bytes_after` is ART's estimate (a 25th of the JSONL size).
    """
    from .parquet import write_groups

    source = Path(jsonl_path)
    result = MigrationResult()
    if not source.exists():
        result.errors.append(f"File not found: {source}")
        return result
    if source.suffix != ".jsonl":
        result.files_skipped = 1
        return result
    target = source.with_suffix(".parquet")
    if target.exists():
        result.errors.append(
            f"Not migrating {source}: {target.name} already exists beside it (rename or "
            "remove one of the two; nothing was changed)"
        )
        return result
    result.bytes_before = source.stat().st_size
    if dry_run:
        result.files_migrated = 1
        result.bytes_after = result.bytes_before // _DRY_RUN_RATIO
        return result
    try:
        groups = _read_jsonl_groups(source)
        split, step = _split_and_step(source)
        with atomic_path(target) as tmp:
            write_groups(tmp, groups, split=split, step=step)
    except (OSError, ValueError, ArtError) as error:
        result.errors.append(f"Error migrating {source}: {error}")
        return result
    result.bytes_after = target.stat().st_size
    result.files_migrated = 1
    if delete_original:
        source.unlink()
    return result


def migrate_trajectories_dir(
    trajectories_dir: Path | str,
    delete_originals: bool = True,
    dry_run: bool = False,
    progress_callback: Callable[[str], None] | None = None,
) -> MigrationResult:
    """Migrate every `.jsonl` file under `trajectories_dir` (subdirectories included)."""
    root = Path(trajectories_dir)
    result = MigrationResult()
    if not root.exists():
        result.errors.append(f"Directory not found: {root}")
        return result
    for jsonl_path in sorted(root.rglob("*.jsonl")):
        if progress_callback is not None:
            progress_callback(str(jsonl_path))
        result += migrate_jsonl_to_parquet(jsonl_path, delete_originals, dry_run)
    return result


def migrate_model_dir(
    model_dir: Path | str,
    delete_originals: bool = True,
    dry_run: bool = False,
    progress_callback: Callable[[str], None] | None = None,
) -> MigrationResult:
    """Migrate `model_dir/trajectories/` (nothing to do, and no error, where there is none)."""
    trajectories_dir = Path(model_dir) / "trajectories"
    if not trajectories_dir.exists():
        return MigrationResult()
    return migrate_trajectories_dir(trajectories_dir, delete_originals, dry_run, progress_callback)


def migrate_all_models(
    art_path: Path | str,
    project_name: str,
    delete_originals: bool = True,
    dry_run: bool = False,
    progress_callback: Callable[[str], None] | None = None,
) -> MigrationResult:
    """Migrate every model of `project_name` stored under `art_path`."""
    models_dir = Path(art_path) / project_name / "models"
    result = MigrationResult()
    if not models_dir.exists():
        result.errors.append(f"Models directory not found: {models_dir}")
        return result
    for model_dir in sorted(models_dir.iterdir()):
        if model_dir.is_dir():
            if progress_callback is not None:
                progress_callback(f"Processing model: {model_dir.name}")
            result += migrate_model_dir(model_dir, delete_originals, dry_run, progress_callback)
    return result


def auto_migrate_on_register(model_dir: Path | str) -> MigrationResult:
    """Migrate a model's JSONL logs (deleting them), print what was saved, warn of errors."""
    result = migrate_model_dir(model_dir, delete_originals=True, dry_run=False)
    if result.files_migrated:
        print(
            f"Migrated {result.files_migrated} trajectory files to Parquet "
            f"(saved {result.space_saved / 1024 / 1024:.1f} MB)"
        )
    if result.errors:
        warnings.warn("\n".join(result.errors), RuntimeWarning, stacklevel=2)
    return result


__all__ = [
    "MigrationResult",
    "auto_migrate_on_register",
    "deserialize_trajectory_groups",
    "dict_to_history",
    "dict_to_message_or_choice",
    "dict_to_trajectory",
    "dict_to_trajectory_group",
    "history_to_dict",
    "message_or_choice_to_dict",
    "migrate_all_models",
    "migrate_jsonl_to_parquet",
    "migrate_model_dir",
    "migrate_trajectories_dir",
    "serialize_trajectory_groups",
    "trajectory_group_to_dict",
    "trajectory_to_dict",
]
