"""The writer lock of a model: one process trains a model at a time.

An exclusive `flock` on the model's `.lock` file, which then holds the holder's pid and
host; the OS frees it when the process dies, so a crash leaves no stale lock. Within a
process it is re-entrant: holds share one descriptor and the lock is freed when the last
is released. A forked child forgets the parent's holds. POSIX only; on Windows nothing is
locked. `ModelStore.hold_writer_lock` is how the rest of `art` takes it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

from ..data.errors import ModelInUseError


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


def take_writer_lock(path: Path) -> WriterLock:
    """A hold on the lock file `path` (`ModelStore.hold_writer_lock` says what it means);
    `ModelInUseError` naming the holder where another process has it."""
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


__all__ = ["WriterLock", "take_writer_lock"]
