"""A grep-able guarantee: no module of `art/` reads another module's private attributes
or imports its private names.

The scan reads every module of `art/` as an AST. A private name (`_x`, not a dunder) is
owned by the modules whose classes define it: a method, a class-level assignment or
annotation, or an assignment to `self._x`. An access `obj._x` (or `getattr(obj, "_x")`)
whose `obj` is not `self` or `cls` is a reach-in when another module owns `_x`: what one
module needs of another's object is that object's public API (`Model.ledger`,
`LocalBackend.service`, ...). ART's own private protocol is excepted: the names ART's
code calls across its modules and a third party's backend implements (`ART_PROTOCOL`).
Nor does a module import another's private name (`from .s3 import _Entry`): what is
shared is named as shared.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import art

ART_ROOT = Path(art.__file__).parent

# ART's private protocol: names ART 0.5.23's own modules use on each other's objects, so
# ours keep them (a backend written for ART implements them; `art run` serves them as
# routes of ART's remote protocol).
ART_PROTOCOL = frozenset(
    {
        "_delete_checkpoint_files",
        "_experimental_fork_checkpoint",
        "_experimental_pull_from_s3",
        "_experimental_push_to_s3",
        "_get_step",
        "_internal_config",
        "_prepare_backend_for_training",
        "_supports_concurrent_training_and_inference",
        "_train_model",
        "_train_sft",
    }
)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def owned_names(tree: ast.Module) -> set[str]:
    """The private names the module's classes define."""
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    names.add(target.attr)
    return {name for name in names if _private(name)}


def private_reads(tree: ast.Module) -> Iterator[tuple[int, str, str]]:
    """Each `obj._x` and `getattr(obj, "_x", ...)` with `obj` not `self` or `cls`:
    (line, obj as written, name)."""
    for node in ast.walk(tree):
        target: ast.expr | None = None
        name = ""
        if isinstance(node, ast.Attribute) and _private(node.attr):
            target, name = node.value, node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            target, name = node.args[0], node.args[1].value
        if target is None or (isinstance(target, ast.Name) and target.id in ("self", "cls")):
            continue
        yield node.lineno, ast.unparse(target), name


def reach_ins(sources: dict[str, str]) -> list[str]:
    """`path:line: obj._x (owned by ...)` for every reach-in among `sources` (path -> code)."""
    trees = {path: ast.parse(code) for path, code in sources.items()}
    owners: defaultdict[str, set[str]] = defaultdict(set)
    for path, tree in trees.items():
        for name in owned_names(tree):
            owners[name].add(path)
    found = []
    for path, tree in trees.items():
        for line, target, name in private_reads(tree):
            others = owners.get(name, set()) - {path}
            if others and name not in ART_PROTOCOL:
                found.append(
                    f"{path}:{line}: {target}.{name} (owned by {', '.join(sorted(others))})"
                )
    return sorted(found)


def private_imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Each private name imported from a module of `art` (relative or absolute)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
            node.level > 0 or (node.module or "").split(".")[0] == "art"
        ):
            for alias in node.names:
                if _private(alias.name):
                    yield node.lineno, f"{node.module or '.'}.{alias.name}"


def _sources() -> dict[str, str]:
    return {
        str(path.relative_to(ART_ROOT.parent)): path.read_text(encoding="utf-8")
        for path in sorted(ART_ROOT.rglob("*.py"))
    }


def test_no_module_of_art_reads_another_modules_private_attributes() -> None:
    assert reach_ins(_sources()) == []


def test_no_module_of_art_imports_another_modules_private_names() -> None:
    found = [
        f"{path}:{line}: {name}"
        for path, code in _sources().items()
        for line, name in private_imports(ast.parse(code))
    ]
    assert found == []


def test_the_scan_finds_a_reach_in_and_leaves_a_classs_own_and_arts_protocol_alone() -> None:
    owner = (
        "class Model:\n"
        "    def __init__(self):\n"
        "        self._ledger = None\n"
        "    def _train_model(self): ...\n"
        "    def same(self, other: 'Model'):\n"
        "        return other._ledger\n"  # another object of its own class: its own module
    )
    reader = (
        "def step(model):\n"
        "    model._ledger\n"
        "    getattr(model, '_ledger', None)\n"
        "    model._train_model()\n"  # ART's protocol
        "    model._unknown\n"  # owned by no module of ours: a third party's
    )
    assert reach_ins({"art/model.py": owner, "art/training.py": reader}) == [
        "art/training.py:2: model._ledger (owned by art/model.py)",
        "art/training.py:3: model._ledger (owned by art/model.py)",
    ]
    imports = "from .s3 import _Entry, client\nfrom art.core.model import _NAME\nimport _thread\n"
    assert list(private_imports(ast.parse(imports))) == [
        (1, "s3._Entry"),
        (2, "art.core.model._NAME"),
    ]
