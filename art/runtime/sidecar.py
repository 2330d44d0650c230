"""The interpreters of the environments that run beside ours: vLLM's and Unsloth's.

Each pins its own torch (and more), so it lives in a venv of its own, built beside the
checkout by `make venv-vllm` / `make venv-unsloth`, or named by an environment variable
(`ART_VLLM_PYTHON`, `ART_UNSLOTH_PYTHON`). `find_python` finds it; `require_python`
turns "not found" into a `ConfigError` naming the field and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.data.errors import ConfigError


def find_python(env_var: str, venv: Path, *, stamp: str | None = None) -> Path | None:
    """The interpreter `env_var` names, else `venv`'s; None if neither.

    `stamp`: a file the venv's build writes last, so a half-built venv is not found.
    """
    configured = os.environ.get(env_var)
    if configured:
        return Path(configured)
    python = venv / "bin" / "python"
    if stamp is not None and not (venv / stamp).exists():
        return None
    return python if python.exists() else None


def require_python(
    found: Path | None, *, env_var: str, field: str, needs: str, fix: str, package: str
) -> Path:
    """`found`, or a `ConfigError` on `field`: `needs` with `fix` when nothing was found,
    or that `env_var` names an interpreter that does not exist."""
    if found is None:
        raise ConfigError(field, f"{needs}, and no environment with it was found", fix)
    if not found.exists():
        raise ConfigError(
            field,
            f"{env_var} is {str(found)!r}, which does not exist",
            f"Point {env_var} at a Python interpreter that has {package} installed",
        )
    return found


__all__ = ["find_python", "require_python"]
