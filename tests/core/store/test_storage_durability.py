"""Checkpoints and atomic writes survive power loss: data reaches the disk before it is published.

A rename is only durable once the directory holding it is synced, and the renamed files
only hold data once they were synced themselves. The test watches the real system calls
(`os.fsync`, `os.replace`) in order, through the paths of the synced descriptors.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from art.core.store.atomic import replace_dir_atomic, write_text_atomic


class _Syscalls:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []


@pytest.fixture
def syscalls(monkeypatch: pytest.MonkeyPatch) -> _Syscalls:
    record = _Syscalls()
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        record.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        record.events.append(("replace", os.fspath(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return record


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name descriptors")
def test_a_checkpoint_is_synced_file_by_file_before_its_rename(
    tmp_path: Path, syscalls: _Syscalls
) -> None:
    target = tmp_path / "checkpoints" / "0001"
    written: list[str] = []

    def fill(directory: Path) -> None:
        (directory / "adapter_model.safetensors").write_bytes(b"weights")
        (directory / "nested").mkdir()
        (directory / "nested" / "optimizer.pt").write_bytes(b"state")
        written.extend(["adapter_model.safetensors", "nested/optimizer.pt"])

    replace_dir_atomic(target, fill)

    publish = syscalls.events.index(("replace", str(target)))
    synced_before = [path for kind, path in syscalls.events[:publish] if kind == "fsync"]
    for name in written:
        assert any(path.endswith(name) for path in synced_before), (name, synced_before)
    # The new directory's own entries, then (after the rename) the parent's.
    assert any(Path(path).name.startswith(".0001.") for path in synced_before)
    synced_after = [path for kind, path in syscalls.events[publish:] if kind == "fsync"]
    assert str(target.parent) in synced_after
    assert (target / "nested" / "optimizer.pt").read_bytes() == b"state"


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name descriptors")
def test_an_atomic_file_write_syncs_the_file_then_its_directory(
    tmp_path: Path, syscalls: _Syscalls
) -> None:
    target = tmp_path / "history.jsonl"
    write_text_atomic(target, "{}\n")
    publish = syscalls.events.index(("replace", str(target)))
    assert any(kind == "fsync" for kind, _ in syscalls.events[:publish])
    assert ("fsync", str(tmp_path)) in syscalls.events[publish:]
    assert target.read_text() == "{}\n"


_WRITES = """
from pathlib import Path
from art.core.store.atomic import replace_dir_atomic, write_text_atomic
from art.core.store.model_store import ModelStore

root = Path("run")
store = ModelStore(root, "project", "model")
store.write_model({"name": "model", "project": "project"})
store.append_history(0, {"val/reward": 1.0})
write_text_atomic(root / "report.html", "<p>report</p>")
replace_dir_atomic(root / "checkpoint", lambda d: (d / "adapter.bin").write_bytes(b"x"))
"""


@pytest.mark.parametrize(
    ("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)]
)
def test_what_is_written_atomically_gets_the_mode_the_users_umask_gives(
    tmp_path: Path, umask: int, file_mode: int, dir_mode: int
) -> None:
    """Temporary files start 0600 (mkstemp) and directories 0700 (mkdtemp); what is
    published is as readable as any file the user writes: reports, histories, adapters."""
    import stat
    import subprocess
    import sys

    for _ in range(2):  # new files, then each written over
        subprocess.run(
            [sys.executable, "-c", _WRITES],
            cwd=tmp_path,
            umask=umask,
            check=True,
            timeout=120,
            env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[3])},
        )
    run = tmp_path / "run"
    files = [run / "report.html", run / "checkpoint" / "adapter.bin"] + [
        run / "project" / "models" / "model" / name for name in ("model.json", "history.jsonl")
    ]
    assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in files} == dict.fromkeys(
        (f.name for f in files), file_mode
    )
    assert stat.S_IMODE((run / "checkpoint").stat().st_mode) == dir_mode
