"""The on-disk layout every backend uses: `<path>/<project>/models/<name>/`.

    model.json                               the model's registration
    history.jsonl                            one metrics row per log/train call, keyed by
                                             ART's metric taxonomy (`history_keys.py`)
    state.json                               ART's model state: the metrics builder's
                                             running totals (`costs/cum/...`)
    trajectories/{split}/{step:04d}.parquet  every logged trajectory, lossless
    checkpoints/{step:04d}/                  a LoRA adapter; the highest one is the current step

    .lock                                    the writer lock of the process training it

`ModelStore` reads and writes these; every write is atomic (`atomic.py`), a training
process holds the writer lock (`writer_lock.py`), and what a log call writes is checked
first (`log_checks.py`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..data.errors import ConfigError
from ..data.log_checks import SPLIT_NAME, check_logged_groups, check_metrics, check_split
from ..data.trajectories import TrajectoryGroup
from ..metrics.history_keys import TRAINING_STEP_KEY, migrate_history_row
from .atomic import atomic_path, replace_dir_atomic, write_text_atomic
from .writer_lock import WriterLock, take_writer_lock

_STEP_DIR = re.compile(r"^\d{4,}$")
# ART's key of the metrics builder's running totals in the model's state.json.
METRICS_BUILDER_STATE_KEY = "_metrics_builder_state"


class ModelStore:
    """Files of one model. Backends read and write a model only through this."""

    def __init__(self, base_path: str | os.PathLike[str], project: str, name: str) -> None:
        self.dir = Path(base_path) / project / "models" / name

    @classmethod
    def at(cls, model_dir: str | os.PathLike[str]) -> ModelStore:
        """The store of the model directory `model_dir` (`<path>/<project>/models/<name>`)."""
        directory = Path(model_dir)
        return cls(directory.parent.parent.parent, directory.parent.parent.name, directory.name)

    # --- registration -------------------------------------------------------------------

    @property
    def model_json(self) -> Path:
        return self.dir / "model.json"

    def read_model(self) -> dict[str, Any] | None:
        """The model's registration; None where it has none (or it was deleted meanwhile)."""
        try:
            text = self.model_json.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        loaded: dict[str, Any] = json.loads(text)
        return loaded

    def write_model(self, data: Mapping[str, Any]) -> None:
        write_text_atomic(self.model_json, json.dumps(data, indent=2, sort_keys=True) + "\n")

    # --- state (ART's `state.json`) -------------------------------------------------------

    @property
    def state_json(self) -> Path:
        return self.dir / "state.json"

    def read_state(self) -> dict[str, Any]:
        """The model's state (ART's `model.read_state()`); {} where there is none."""
        try:
            text = self.state_json.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        loaded = json.loads(text)
        return loaded if isinstance(loaded, dict) else {}

    def merge_state(self, update: Mapping[str, Any]) -> None:
        """Set `update`'s top-level keys in the state, keeping the others (an atomic write)."""
        state = self.read_state() | dict(update)
        write_text_atomic(self.state_json, json.dumps(state, indent=2, sort_keys=True) + "\n")

    # --- the writer lock ----------------------------------------------------------------

    @property
    def lock_path(self) -> Path:
        return self.dir / ".lock"

    def hold_writer_lock(self) -> WriterLock:
        """Hold the model's writer lock until `release()` (or this process's end).

        The process that trains a model holds it, so a second process training the same
        model (the same `path`, project and name) is refused with `ModelInUseError`
        naming the holder's pid, instead of both writing steps over each other. It is an
        exclusive `flock` on `.lock` in the model's directory, which then holds the
        holder's pid and host; the OS frees it when the process dies, so a crash leaves
        no stale lock. Within one process it is re-entrant: each call returns a hold of
        its own and the lock is freed when the last is released (a service may load a
        model again). A process forked from the holder does not hold it.

        POSIX only (`fcntl`); on Windows nothing is locked. On a network filesystem it is
        as good as that filesystem's `flock`.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        return take_writer_lock(self.lock_path.resolve())

    # --- steps and checkpoints ------------------------------------------------------------

    @property
    def checkpoints_dir(self) -> Path:
        return self.dir / "checkpoints"

    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints_dir / f"{step:04d}"

    def checkpoint_steps(self) -> list[int]:
        """Steps with a complete checkpoint, ascending. Temporary directories are ignored."""
        if not self.checkpoints_dir.is_dir():
            return []
        return sorted(
            int(entry.name)
            for entry in self.checkpoints_dir.iterdir()
            if entry.is_dir() and _STEP_DIR.match(entry.name)
        )

    def step(self) -> int:
        """The current step: the highest checkpoint, or 0 before any training."""
        steps = self.checkpoint_steps()
        return steps[-1] if steps else 0

    def delete(self) -> None:
        """Remove the model's directory: renamed to a hidden name first, so it is gone from
        view at once even if the removal is cut off (listings skip hidden entries)."""
        if not self.dir.exists():
            return
        doomed = self.dir.with_name(f".{self.dir.name}.deleting")
        shutil.rmtree(doomed, ignore_errors=True)  # left by a removal cut off before
        self.dir.rename(doomed)
        shutil.rmtree(doomed)

    def delete_checkpoints(self, keep: set[int]) -> list[int]:
        """Delete every checkpoint whose step is not in `keep`; return the deleted steps."""
        deleted = [step for step in self.checkpoint_steps() if step not in keep]
        for step in deleted:
            target = self.checkpoint_dir(step)
            doomed = target.with_name(f".{target.name}.deleting")
            os.replace(target, doomed)  # gone from view at once, even if rmtree is interrupted
            shutil.rmtree(doomed)
        return deleted

    def delete_checkpoints_but_best(self, metric: str) -> list[int]:
        """Keep the latest checkpoint and the step with the best mean `metric`; delete the rest.

        As ART 0.5.18: the best step is the one whose history rows average highest on
        `metric` (later step on a tie). Where there is no history yet, or no row has the
        metric (ART's examples call this at every step from step 0, before anything is
        validated), a note is printed and only the latest checkpoint is kept.
        """
        steps = self.checkpoint_steps()
        keep = {steps[-1] if steps else 0}
        if not self.history_path.exists():
            print(f'"{self.history_path}" not found')
        elif means := self.metric_by_step(metric):
            keep.add(max(means, key=lambda step: (means[step], step)))
        else:
            print(f'No "{metric}" metric found in history')
        return self.delete_checkpoints(keep=keep)

    def metric_by_step(self, metric: str) -> dict[int, float]:
        """Each step's mean of `metric` over the history rows that have it."""
        values: dict[int, list[float]] = {}
        for row in self.read_history():
            value = row.get(metric)
            if isinstance(value, int | float) and isinstance(row.get("step"), int):
                values.setdefault(row["step"], []).append(float(value))
        return {step: sum(v) / len(v) for step, v in values.items()}

    # --- metrics history --------------------------------------------------------------------

    @property
    def history_path(self) -> Path:
        return self.dir / "history.jsonl"

    def read_history(self) -> list[dict[str, Any]]:
        """Every row, in order, under this version's key names: a row written before
        history keys took ART's taxonomy is renamed as it is read (the file is untouched)."""
        if not self.history_path.exists():
            return []
        rows = []
        for line in self.history_path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rows.append(migrate_history_row(json.loads(line)))
        return rows

    def append_history(
        self, step: int, metrics: Mapping[str, float | int | bool]
    ) -> dict[str, Any]:
        """Add one row; the file is rewritten whole and renamed, so a crash loses no rows.

        The row holds `step`, `recorded_at` and, as ART's rows do, `training_step` (the
        same step: the x-axis W&B plots every metric against).
        """
        check_metrics(metrics)
        row: dict[str, Any] = {
            "step": step,
            "recorded_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            TRAINING_STEP_KEY: step,
        }
        for key, value in metrics.items():
            if isinstance(value, float) and not math.isfinite(value):
                continue  # JSON has no NaN; an undefined metric is left out
            row[key] = value
        existing = (
            self.history_path.read_text(encoding="utf-8") if self.history_path.exists() else ""
        )
        if existing and not existing.endswith("\n"):
            existing += "\n"
        write_text_atomic(self.history_path, existing + json.dumps(row) + "\n")
        return row

    # --- trajectories -------------------------------------------------------------------

    def trajectories_path(self, split: str, step: int) -> Path:
        return self.dir / "trajectories" / check_split(split) / f"{step:04d}.parquet"

    def write_log(
        self,
        split: str,
        step: int,
        groups: list[TrajectoryGroup],
        metrics: Mapping[str, float | int | bool],
    ) -> None:
        """A backend's `log`: the groups (if any) into the step's Parquet file of `split`,
        then the row of `metrics` (if any) into the history."""
        if groups:
            self.write_trajectories(split, step, groups)
        if metrics:
            self.append_history(step, metrics)

    def write_trajectories(self, split: str, step: int, groups: list[TrajectoryGroup]) -> Path:
        """Store groups in the step's Parquet file, after any groups already logged there.

        The `train` split holds what a step trained on, so a group already stored there
        (a `train` retried after a failure or a crash) is not stored again.
        """
        from . import parquet

        check_logged_groups(groups)
        path = self.trajectories_path(split, step)
        existing = parquet.read_groups(path) if path.exists() else []
        if split == "train":
            stored = {_fingerprint(group) for group in existing}
            groups = [group for group in groups if _fingerprint(group) not in stored]
            if not groups:
                return path
        with atomic_path(path) as tmp:
            parquet.write_groups(tmp, existing + groups, split=split, step=step)
        return path

    def read_trajectories(self, split: str, step: int) -> list[TrajectoryGroup]:
        from . import parquet

        path = self.trajectories_path(split, step)
        return parquet.read_groups(path) if path.exists() else []

    def logged_splits(self) -> list[str]:
        """Splits with at least one trajectory file, sorted."""
        root = self.dir / "trajectories"
        if not root.is_dir():
            return []
        return sorted(
            entry.name
            for entry in root.iterdir()
            if entry.is_dir() and SPLIT_NAME.match(entry.name) and self.logged_steps(entry.name)
        )

    def logged_steps(self, split: str) -> list[int]:
        """Steps with a trajectory file in `split`, ascending. Temporary files are ignored."""
        root = self.dir / "trajectories" / check_split(split)
        if not root.is_dir():
            return []
        return sorted(
            int(entry.name.removesuffix(".parquet"))
            for entry in root.iterdir()
            if entry.is_file()
            and entry.name.endswith(".parquet")
            and _STEP_DIR.match(entry.name.removesuffix(".parquet"))
        )


def fork_checkpoint(
    target: ModelStore,
    base_model: str,
    source: ModelStore,
    not_after_step: int | None = None,
) -> Path:
    """Copy `source`'s latest checkpoint (at or before `not_after_step`) into `target` as
    its checkpoint of the same step; returns the directory copied. Refused: a source with
    another base model, or a target already at that step or later (ART's experimental
    fork; the caller holds the target's writer lock and tells its engine)."""
    steps = source.checkpoint_steps()
    if not steps:
        raise FileNotFoundError(f"{source.checkpoints_dir} holds no checkpoints to fork from")
    eligible = [s for s in steps if not_after_step is None or s <= not_after_step]
    if not eligible:
        raise ConfigError(
            "not_after_step",
            f"{source.dir.name} has no checkpoint at or before step {not_after_step}",
            f"Pick one of its steps: {', '.join(map(str, steps))}",
        )
    step = eligible[-1]
    record = source.read_model() or {}
    if record.get("base_model") != base_model:
        raise ConfigError(
            "from_model",
            f"{source.dir.name} was trained on {record.get('base_model')!r}, and {target.dir.name} "
            f"is {base_model!r}: its adapter would not fit",
            "Fork from a model with the same base_model",
        )
    if target.step() >= step:
        raise ConfigError(
            "model",
            f"{target.dir.name} is at step {target.step()} already, not before the forked "
            f"step {step}",
            "Fork into a new model, or pick an earlier step with not_after_step",
        )
    source_dir = source.checkpoint_dir(step)

    def copy(tmp: Path) -> None:
        shutil.copytree(source_dir, tmp, dirs_exist_ok=True)

    replace_dir_atomic(target.checkpoint_dir(step), copy)
    return source_dir


def list_projects(base_path: str | os.PathLike[str]) -> list[str]:
    """Projects under a backend's `path`: directories holding a `models/` directory."""
    root = Path(base_path)
    if not root.is_dir():
        return []
    return sorted(entry.name for entry in root.iterdir() if (entry / "models").is_dir())


def list_models(base_path: str | os.PathLike[str], project: str) -> list[str]:
    """Names of the models stored for `project`, sorted (hidden temporary entries skipped)."""
    root = Path(base_path) / project / "models"
    if not root.is_dir():
        return []
    return sorted(
        entry.name for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith(".")
    )


def _fingerprint(group: TrajectoryGroup) -> str:
    """The group's content as canonical JSON: equal for a group and its stored copy."""
    return json.dumps(group.model_dump(mode="json"), sort_keys=True)


__all__ = [
    "METRICS_BUILDER_STATE_KEY",
    "ModelStore",
    "fork_checkpoint",
    "list_models",
    "list_projects",
]
