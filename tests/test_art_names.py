"""Every public module and name of ART 0.5.18's and 0.5.23's wheels works here or is refused.

The name lists were walked from the wheels by `scripts/art_names.py walk` and are checked
in (tests/data/art_names/); docs/reference/art-names.md is generated from them by
`scripts/art_names.py table`, and must be current.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("art_names", ROOT / "scripts" / "art_names.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["art_names"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


art_names = _script()


def test_the_lists_hold_both_versions_whole() -> None:
    assert art_names.versions() == ["0.5.18", "0.5.23"]
    older, newer = art_names.load("0.5.18"), art_names.load("0.5.23")
    assert (len(older), len(newer)) == (186, 320)
    assert "TrainableModel" in older["art"]
    assert "LoRAConfig" in newer["art"]


def test_every_module_and_name_works_or_is_refused_with_a_reason() -> None:
    assert art_names.problems() == []


def test_the_generated_table_is_current() -> None:
    current = art_names.TABLE.read_text()
    assert current == art_names.render_table(), (
        "docs/reference/art-names.md is out of date: run `python scripts/art_names.py table`"
    )


def test_an_art_internal_module_is_refused_on_import_with_what_to_use() -> None:
    with pytest.raises(ModuleNotFoundError, match="Megatron-LM trainer") as refused:
        importlib.import_module("art.megatron.lora")
    assert refused.value.name == "art.megatron"  # the package, imported first
    assert "LocalBackend" in str(refused.value)
    # What ART's own optional imports catch.
    with pytest.raises(ImportError, match="hosted Tinker service"):
        import art.tinker  # type: ignore[import-untyped]  # noqa: F401
    # A name that is no module of ART's is answered as Python always does.
    with pytest.raises(ModuleNotFoundError, match=r"No module named 'art\.no_such_module'"):
        importlib.import_module("art.no_such_module")


def test_the_refusal_is_there_in_a_fresh_interpreter() -> None:
    code = "import art\ntry:\n import art.vllm_runtime\nexcept ImportError as e:\n print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("art.vllm_runtime is not built here: part of how ART's")
