"""The on-disk layout every backend uses: `<path>/<project>/models/<name>/`.

    model.json                               the model's registration
    history.jsonl                            one metrics row per log/train call
    trajectories/{split}/{step:04d}.parquet  every logged trajectory, lossless
    checkpoints/{step:04d}/                  a LoRA adapter; the highest one is the current step

    .lock                                    the writer lock of the process training it

Every write goes to a temporary file in the same directory and is renamed into place,
so a crash leaves either the old file or the new one, never half of one. The new data is
fsynced before the rename and the directory after it, so a power loss cannot publish a
name whose contents never reached the disk, nor forget a rename that was reported done.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .errors import ConfigError, ModelInUseError, StorageError, TrajectoryValidationError
from .trajectories import TrajectoryGroup

_STEP_DIR = re.compile(r"^\d{4,}$")
# Columns every history row has, which no logged metric may overwrite.
RESERVED_METRICS = frozenset({"step", "recorded_at"})
_SPLIT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


def fsync_dir(directory: Path) -> None:
    """Make the entries of `directory` (creations, renames) durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Sync every file under `root`, then every directory bottom-up, `root` last."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_file(Path(directory, name))
        fsync_dir(Path(directory))


@contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """Yield a temporary path beside `target`; rename it onto `target` if the block succeeds."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        # mkstemp's file is mode 0600; made again, it gets the mode of any file the user
        # writes (the umask applied), so a page or a history is readable like the rest.
        tmp.unlink()
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        yield tmp
        fsync_file(tmp)  # the writer may not have synced (Parquet, HTML reports)
        os.replace(tmp, target)
        fsync_dir(target.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(target: Path, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")


def replace_dir_atomic(target: Path, fill: Callable[[Path], None]) -> None:
    """Build a directory with `fill(tmp_dir)` and rename it onto `target` in one step.

    A write the disk refuses (an `OSError`: a full disk, a quota, a permission) raises
    `StorageError` naming the directory, the reason, the free space and the space needed;
    the temporary directory is removed and `target` is left as it was. `fill` should
    write through Python file objects: torch and safetensors given a path raise their
    own errors instead (`RuntimeError: ... unexpected pos` for a full disk).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        try:
            tmp.rmdir()  # mkdtemp's is mode 0700: made again, the umask applies
            tmp.mkdir()
            fill(tmp)
            fsync_tree(tmp)
        except OSError as error:
            raise _write_failure(target, tmp, error) from error
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp, target)
            fsync_dir(target.parent)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
            fsync_dir(target.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_failure(target: Path, tmp: Path, error: OSError) -> StorageError:
    """The error for `error`, raised while filling `tmp` for `target`. Removes `tmp` first,
    so the free space it reports is what the failed write left."""
    written = _tree_size(tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    free = shutil.disk_usage(target.parent).free
    previous = _previous_version(target)
    if previous is not None:
        needed: int | None = _tree_size(previous)
        estimate = f"about {needed:,} bytes (the size of {previous}, the one before it)"
    else:
        needed = None
        estimate = f"more than the {written:,} bytes written before it failed"
    return StorageError(
        f"cannot write {target}: {error.strerror or error}. Its filesystem has {free:,} "
        f"bytes free; the write needs {estimate}. Free space there (or point the "
        f"backend's `path` at a larger disk) and try again: nothing already saved changed",
        path=str(target),
        free_bytes=free,
        needed_bytes=needed,
    )


def _previous_version(target: Path) -> Path | None:
    """`target` as it is, or else the last directory beside it by name (checkpoints are
    named by step, so: the previous checkpoint); None when there is neither."""
    if target.is_dir():
        return target
    siblings = [
        entry
        for entry in target.parent.iterdir()
        if entry.is_dir() and not entry.name.startswith(".")
    ]
    return max(siblings, default=None)


def _tree_size(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


def check_metrics(metrics: Mapping[str, object], where: str = "metrics") -> None:
    """Refuse a metric a history row cannot hold: a reserved or empty name, or a non-number."""
    for key, value in metrics.items():
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(
                where, f"metric name {key!r} is not a non-empty string", "Name every metric"
            )
        if key in RESERVED_METRICS:
            raise ConfigError(
                f"{where}[{key!r}]",
                f"{key!r} is a column every history row already has",
                "Pass the step as `step=`, and give the metric another name",
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(
                f"{where}[{key!r}]",
                f"a metric must be a number (int, float or bool), got {type(value).__name__}",
                "Log plain numbers (`float(value)` for numpy or torch scalars); put text in a "
                "trajectory's metadata",
            )


def check_logged_groups(groups: list[TrajectoryGroup], where: str = "trajectory_groups") -> None:
    """Refuse a group with neither trajectories nor exceptions: it records nothing."""
    for index, group in enumerate(groups):
        if not group.trajectories and not group.exceptions:
            raise TrajectoryValidationError(
                f"{where}[{index}]",
                "the group is empty",
                "Give every group at least one trajectory, or leave the group out",
            )


def check_split(split: str) -> str:
    if not isinstance(split, str) or not _SPLIT.match(split):
        raise ConfigError(
            "split",
            f"{split!r} cannot be used as a directory name",
            "Use letters, digits, '_' or '-', such as 'train' or 'val'",
        )
    return split


class ModelStore:
    """Files of one model. Backends read and write a model only through this."""

    def __init__(self, base_path: str | os.PathLike[str], project: str, name: str) -> None:
        self.dir = Path(base_path) / project / "models" / name

    # --- registration -------------------------------------------------------------------

    @property
    def model_json(self) -> Path:
        return self.dir / "model.json"

    def read_model(self) -> dict[str, Any] | None:
        if not self.model_json.exists():
            return None
        loaded: dict[str, Any] = json.loads(self.model_json.read_text(encoding="utf-8"))
        return loaded

    def write_model(self, data: Mapping[str, Any]) -> None:
        write_text_atomic(self.model_json, json.dumps(data, indent=2, sort_keys=True) + "\n")

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
        return _take_writer_lock(self.lock_path.resolve())

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
        if not self.history_path.exists():
            return []
        rows = []
        for line in self.history_path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rows.append(json.loads(line))
        return rows

    def append_history(
        self, step: int, metrics: Mapping[str, float | int | bool]
    ) -> dict[str, Any]:
        """Add one row; the file is rewritten whole and renamed, so a crash loses no rows."""
        check_metrics(metrics)
        row: dict[str, Any] = {
            "step": step,
            "recorded_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
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
            if entry.is_dir() and _SPLIT.match(entry.name) and self.logged_steps(entry.name)
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


class WriterLock:
    """One hold on a model's writer lock (`ModelStore.hold_writer_lock`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._released = False

    def release(self) -> None:
        """Give this hold up; the lock is freed when the process's last hold is. Idempotent."""
        if self._released:
            return
        self._released = True
        _drop_writer_lock(self.path)

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# Writer locks this process holds: lock file -> [open descriptor, holds]. A flock belongs
# to an open file, so a second open() of the file in this process would be refused too:
# holds in one process share one descriptor.
_HELD: dict[Path, list[int]] = {}
_HELD_LOCK = threading.Lock()


def _take_writer_lock(path: Path) -> WriterLock:
    try:
        import fcntl
    except ImportError:  # Windows: no flock
        return WriterLock(path)
    with _HELD_LOCK:
        held = _HELD.get(path)
        if held is not None:
            held[1] += 1
            return WriterLock(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise ModelInUseError(str(path.parent), *holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        owner = {"pid": os.getpid(), "host": socket.gethostname()}
        os.pwrite(fd, (json.dumps(owner) + "\n").encode(), 0)
        _HELD[path] = [fd, 1]
        return WriterLock(path)


def _drop_writer_lock(path: Path) -> None:
    with _HELD_LOCK:
        held = _HELD.get(path)
        if held is None:  # Windows, or a hold inherited through fork
            return
        held[1] -= 1
        if held[1]:
            return
        del _HELD[path]
        os.ftruncate(held[0], 0)  # no holder named once it is free
        os.close(held[0])  # frees the flock


def _read_holder(fd: int) -> tuple[int | None, str | None]:
    """The pid and host the holder wrote (None: not written yet, or unreadable)."""
    try:
        owner = json.loads(os.pread(fd, 4096, 0))
        return int(owner["pid"]), str(owner["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


def _forget_held_locks() -> None:
    # A forked child shares the parent's open files but is not the process that trains;
    # closing its copies leaves the parent's lock in place. Another thread may have held
    # `_HELD_LOCK` at the fork, so the child gets a new one.
    global _HELD_LOCK
    _HELD_LOCK = threading.Lock()
    for fd, _ in _HELD.values():
        os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_held_locks)


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
    "RESERVED_METRICS",
    "ModelStore",
    "WriterLock",
    "atomic_path",
    "check_logged_groups",
    "check_metrics",
    "check_split",
    "fsync_dir",
    "fsync_tree",
    "list_models",
    "list_projects",
    "replace_dir_atomic",
    "write_text_atomic",
]
