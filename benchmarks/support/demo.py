"""`examples/demo.py` as a module: the task (questions, system prompt, reward) several
benchmarks measure on, so they train and score exactly what `make demo` does."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

PATH = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


@functools.cache
def demo_module() -> ModuleType:
    """The demo script loaded once (it is a script, not an importable module)."""
    spec = importlib.util.spec_from_file_location("art_demo", PATH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


__all__ = ["PATH", "demo_module"]
