"""`art.core`'s layers import only downwards (the order is in `art/core/__init__.py`).

Every import counts: at module level, inside `TYPE_CHECKING`, inside a function. The
data model (`data/`) imports nothing else of `art`; `capture/` and `metrics/` only the
data model; `store/` the data model and the metric names; the top (the modules of
`art/core/` itself) any layer; and nothing in `art.core` imports outside it.
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "art" / "core"

# The layers each layer may import, itself included; "top" is art/core's own modules.
MAY_IMPORT = {
    "data": {"data"},
    "capture": {"data", "capture"},
    "metrics": {"data", "metrics"},
    "store": {"data", "metrics", "store"},
    "top": {"data", "capture", "metrics", "store", "top"},
}


def layer_of(module: str) -> str | None:
    """The layer of a dotted module under `art.core` ("top" for its own modules), None
    for a module outside `art.core`."""
    parts = module.split(".")
    if parts[:2] != ["art", "core"]:
        return None
    return parts[2] if len(parts) > 3 and parts[2] in MAY_IMPORT else "top"


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, dotted module) of each import of an `art` module in `source`, relative
    imports resolved against `package`; `from pkg import name` counts as `pkg.name`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return [(line, module) for line, module in found if module.split(".")[0] == "art"]


def violations(source: str, module: str) -> list[str]:
    """Each import in `source` (the text of `module`) that runs upwards or out of `art.core`."""
    layer = layer_of(module)
    assert layer is not None
    package = module if module.endswith("__init__") else module.rsplit(".", 1)[0]
    package = package.removesuffix(".__init__")
    wrong = []
    for line, target in imported_modules(source, package):
        target_layer = layer_of(target)
        if target_layer is None:
            wrong.append(f"{module}:{line} imports {target}, outside art.core")
        elif target_layer not in MAY_IMPORT[layer]:
            wrong.append(f"{module}:{line} ({layer}) imports {target} ({target_layer})")
    return wrong


def module_name(path: Path) -> str:
    return ".".join(("art", "core", *path.relative_to(CORE).with_suffix("").parts))


def test_every_import_in_art_core_runs_downwards() -> None:
    paths = sorted(CORE.rglob("*.py"))
    assert len(paths) > 40
    wrong = [v for path in paths for v in violations(path.read_text(), module_name(path))]
    assert wrong == []


def test_each_layer_is_a_folder_of_modules() -> None:
    for layer in MAY_IMPORT.keys() - {"top"}:
        assert (CORE / layer / "__init__.py").is_file(), layer
        assert len(list((CORE / layer).glob("*.py"))) > 2, layer


def test_the_check_finds_an_upward_import_and_one_out_of_core() -> None:
    planted = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from .errors import ConfigError\n"
        "if TYPE_CHECKING:\n"
        "    from ..store.atomic import write_text_atomic\n"
        "def f() -> None:\n"
        "    from ...runtime import process\n"
        "    from .. import model\n"
    )
    assert violations(planted, "art.core.data.planted") == [
        "art.core.data.planted:5 (data) imports art.core.store.atomic.write_text_atomic (store)",
        "art.core.data.planted:7 imports art.runtime.process, outside art.core",
        "art.core.data.planted:8 (data) imports art.core.model (top)",
    ]
    assert violations(planted.replace("..store", "..data"), "art.core.store.planted") == [
        "art.core.store.planted:7 imports art.runtime.process, outside art.core",
        "art.core.store.planted:8 (store) imports art.core.model (top)",
    ]
    top = "from .store.atomic import write_text_atomic\nfrom ..runtime import process\n"
    assert violations(top, "art.core.model") == [
        "art.core.model:2 imports art.runtime.process, outside art.core"
    ]
