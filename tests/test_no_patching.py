"""A grep-able guarantee: no code in `art/` assigns to an attribute of another library.

The scan reads every module of `art/` as an AST and flags an assignment (`=`, `+=`,
annotated, `del`) or `setattr`/`delattr` call whose target object is a module or class
imported from outside `art`: named directly (`httpx.Client.send = ...`), through a local
alias (`cls = httpx.Client`, `for cls in (httpx.Client, ...)`), or through a function of
the same module that returns such names (`for cls in _clients(): cls.send = ...`).
Instances are not flagged (`response.stream = ...` changes one object we hold).
"""

from __future__ import annotations

import ast
from pathlib import Path

import art

ART_ROOT = Path(art.__file__).parent


def _imported_names(tree: ast.Module) -> set[str]:
    """Names bound anywhere in the module by importing something from outside `art`."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "art":
                    names.add(alias.asname or alias.name.split(".")[0])
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] != "art"
        ):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


class _Scan:
    def __init__(self, tree: ast.Module) -> None:
        self.foreign = _imported_names(tree)
        # Module functions that return foreign objects: calls to them are foreign too.
        self.returning: set[str] = set()
        functions = [
            n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        for _ in range(3):  # a function may return another's result
            for function in functions:
                aliases = self._aliases(function)
                returns = [n for n in ast.walk(function) if isinstance(n, ast.Return)]
                if any(r.value is not None and self._foreign(r.value, aliases) for r in returns):
                    self.returning.add(function.name)
        self.functions = functions

    def _foreign(self, node: ast.expr, aliases: set[str]) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.foreign or node.id in aliases
        if isinstance(node, ast.Attribute):
            return self._foreign(node.value, aliases)
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            return any(self._foreign(element, aliases) for element in node.elts)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            return node.func.id in self.returning
        return False

    def _aliases(self, function: ast.AST) -> set[str]:
        aliases: set[str] = set()
        for _ in range(3):
            for node in ast.walk(function):
                bound: list[ast.expr] = []
                value: ast.expr | None = None
                if isinstance(node, ast.Assign):
                    bound, value = node.targets, node.value
                elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
                    bound, value = [node.target], node.value
                elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
                    bound, value = [node.target], node.iter
                if value is not None and self._foreign(value, aliases):
                    aliases.update(t.id for t in bound if isinstance(t, ast.Name))
        return aliases

    def violations(self, tree: ast.Module) -> list[str]:
        found: list[str] = []
        scopes: list[ast.AST] = [*self.functions, tree]
        for scope in scopes:
            aliases = self._aliases(scope) if scope is not tree else set()
            for node in ast.walk(scope):
                targets: list[ast.expr] = []
                if isinstance(node, ast.Assign | ast.Delete):
                    targets = node.targets
                elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                    targets = [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and self._foreign(target.value, aliases):
                        found.append(f"line {target.lineno}: {ast.unparse(target)}")
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("setattr", "delattr")
                    and node.args
                    and self._foreign(node.args[0], aliases)
                ):
                    found.append(f"line {node.lineno}: {ast.unparse(node)}")
        return sorted(set(found))


def violations(source: str) -> list[str]:
    tree = ast.parse(source)
    return _Scan(tree).violations(tree)


def test_the_scan_finds_each_way_of_patching() -> None:
    patches = {
        "import httpx\nhttpx.Client.send = None": 1,
        "import httpx as h\ndef f():\n    setattr(h.AsyncClient, 'send', None)": 1,
        "from transformers import Trainer\ndef f():\n    Trainer.step += 1": 1,
        "import httpx\ndef f():\n    for c in (httpx.Client, httpx.AsyncClient):\n"
        "        c.send = None": 1,
        "import httpx\ndef _clients():\n    classes = [httpx.Client]\n    return classes\n"
        "def patch():\n    for client in _clients():\n        client.send = None": 1,
        "import vllm\ndef f():\n    del vllm.envs.X": 1,
    }
    for source, count in patches.items():
        assert len(violations(source)) == count, source
    allowed = [
        "import httpx\ndef f(response: httpx.Response):\n    response.stream = None",
        "import httpx\ndef f():\n    client = httpx.Client()\n    client.timeout = 3",
        "from .core import model\nmodel.x = 1",
        "class A:\n    def f(self):\n        self.x = 1",
    ]
    for source in allowed:
        assert violations(source) == [], source


def test_no_module_of_art_assigns_to_another_librarys_attributes() -> None:
    found = {
        str(path.relative_to(ART_ROOT.parent)): hits
        for path in sorted(ART_ROOT.rglob("*.py"))
        if (hits := violations(path.read_text(encoding="utf-8")))
    }
    assert found == {}
