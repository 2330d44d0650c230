"""`art runtime status|prepare` (ART 0.5.23's `art runtime`): this machine's environments, and
building the missing ones with the checkout's make targets.

Status runs on this checkout; prepare runs a real `make` on a stand-in checkout in a temporary
folder whose `venv-vllm` target links the real vLLM environment, so it stays fast.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from art.cli import main
from art.runtime.engines.vllm.server import find_vllm_python
from art.runtime.environments import (
    PrepareError,
    inspect_environments,
    preparation_commands,
    prepare_environments,
)
from art.runtime.trainer.unsloth_trainer import find_unsloth_python


@pytest.fixture(autouse=True)
def checkout_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkout's own environments, whatever the caller's shell points at."""
    monkeypatch.delenv("ART_VLLM_PYTHON", raising=False)
    monkeypatch.delenv("ART_UNSLOTH_PYTHON", raising=False)


def test_status_reports_each_environment_as_the_engines_find_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["runtime", "status", "--no-size"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    import torch

    assert lines[0].startswith("cuda: ")
    assert ("not available" in lines[0]) == (not torch.cuda.is_available())
    assert f"  runtime: {sys.executable}" in lines
    found = {"vllm": find_vllm_python(), "unsloth": find_unsloth_python()}
    for name, python in found.items():
        line = next(line for line in lines if line.startswith(f"{name}: "))
        # Ready exactly where the engine or trainer would find its interpreter.
        assert line.startswith(f"{name}: ready (checkout, ") == (python is not None), line
        if python is not None:
            assert f"  runtime: {python}" in lines
    assert main(["runtime", "status", "--multinode"]) == 2
    assert "--multinode: ART's Megatron runtime" in capsys.readouterr().err


def test_prepare_builds_what_is_missing_with_the_make_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vllm = find_vllm_python()
    if vllm is None:
        pytest.skip("no vLLM environment to stand in for a build (make venv-vllm)")
    unsloth = find_unsloth_python()
    # A stand-in checkout: its venv-vllm target "builds" .venv-vllm by linking the real
    # environment (as scripts/venv.sh links its cached one); Unsloth's is there already.
    (tmp_path / "Makefile").write_text(f"venv-vllm:\n\tln -s {vllm.parent.parent} .venv-vllm\n")
    if unsloth is not None:
        (tmp_path / ".venv-unsloth").symlink_to(unsloth.parent.parent)
    before = {s.name: s for s in inspect_environments(root=tmp_path)}
    assert not before["vllm"].ready
    assert before["vllm"].mode == "unavailable"
    commands = preparation_commands(list(before.values()), root=tmp_path)
    assert ("vllm", ["make", "-C", str(tmp_path), "venv-vllm"]) in commands

    if unsloth is None:
        with pytest.raises(PrepareError, match="venv-unsloth"):
            prepare_environments(root=tmp_path, progress=print)
        return
    prepared = {status.name: status for status, _ in prepare_environments(root=tmp_path)}
    assert prepared["vllm"].ready
    assert prepared["vllm"].python == tmp_path / ".venv-vllm" / "bin" / "python"
    assert "building vllm: make -C" in capsys.readouterr().out
    # Ready now: nothing left to build.
    assert preparation_commands(inspect_environments(root=tmp_path), root=tmp_path) == []


def test_prepare_never_builds_over_an_interpreter_the_user_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ART_VLLM_PYTHON", str(tmp_path / "missing" / "python"))
    status = next(s for s in inspect_environments() if s.name == "vllm")
    assert (status.ready, status.mode) == (False, "override")
    with pytest.raises(PrepareError, match="ART_VLLM_PYTHON names"):
        preparation_commands([status])
    assert main(["runtime", "prepare", "--dry-run"]) == 1
    assert "unset ART_VLLM_PYTHON" in capsys.readouterr().err


def test_the_console_command_and_arts_python_names_agree() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "art", "runtime", "prepare", "--dry-run"],
        capture_output=True,
        text=True,
        check=False,
    )
    expected = {
        status.name
        for status in inspect_environments()
        if not status.ready and status.name != "main"
    }
    assert out.returncode == 0, out.stderr
    for name in expected:
        assert f"{name}: would run make -C" in out.stdout
    if not expected:
        assert "nothing to build" in out.stdout
    import art.cli

    assert callable(art.cli.runtime_status)
    assert callable(art.cli.runtime_prepare)
    with pytest.raises(SystemExit) as exited:
        art.cli.runtime_prepare(hybrid_ep=True)
    assert exited.value.code == 2
