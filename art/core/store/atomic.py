"""Atomic file writes: a crash leaves either the old file or the new one, never half of one.

Every write goes to a temporary file (or directory) beside its target and is renamed
into place. The new data is fsynced before the rename and the directory after it, so a
power loss cannot publish a name whose contents never reached the disk, nor forget a
rename that was reported done. A write the disk refuses raises `StorageError` naming the
space it needed, and leaves the target as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..data.errors import StorageError


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


__all__ = [
    "atomic_path",
    "fsync_dir",
    "fsync_file",
    "fsync_tree",
    "replace_dir_atomic",
    "write_text_atomic",
]
