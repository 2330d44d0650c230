"""Every public module and name of OpenPipe ART's wheels, and what `art` does with each.

Two jobs:

    python3.12 scripts/art_names.py walk WHEEL [WHEEL ...]
        Reads each wheel (a zip; nothing of it is imported or run), walks its `art` package
        and writes tests/data/art_names/<version>.json: each public module (no path part
        starting with `_`) and its public names: `__all__` where the module has one, else
        the functions, classes and assignments at its top level (and, in a package's
        `__init__`, what it imports by name), type variables left out. Run it with a Python that parses the wheel's
        syntax (3.12 for ART 0.5.23).

    python scripts/art_names.py table
        Imports each of those modules and names here and writes docs/reference/art-names.md:
        each one "works" (with the tests that name it) or "refused" (with the reason this
        checkout gives when it is imported or used). tests/test_art_names.py checks that the
        table is current and that nothing is neither.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "art_names"
TABLE = ROOT / "docs" / "reference" / "art-names.md"
TESTS = ROOT / "tests"
_PUBLIC_API_TEST = "tests/test_public_api.py"


# --- walking a wheel ----------------------------------------------------------------------


def _public_names(tree: ast.Module, is_package: bool) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            try:
                return sorted({str(name) for name in ast.literal_eval(node.value)})
            except ValueError:  # built by an expression: read the module's names instead
                break
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign) and not _is_type_variable(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif is_package and isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names if alias.name != "*")
    return sorted(name for name in names if not name.startswith("_"))


def _is_type_variable(value: ast.expr) -> bool:
    """`T = TypeVar("T")` and its kin: typing helpers of the module, not its API."""
    if not isinstance(value, ast.Call):
        return False
    called = value.func
    name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
    return name in {"TypeVar", "ParamSpec", "TypeVarTuple"}


def walk_wheel(wheel: Path) -> tuple[str, dict[str, list[str]]]:
    """(ART's version, {public module: its public names}) read from a wheel file."""
    version = wheel.name.split("-")[1]
    modules: dict[str, list[str]] = {}
    with zipfile.ZipFile(wheel) as archive:
        for path in archive.namelist():
            if not (path.startswith("art/") and path.endswith(".py")):
                continue
            parts = path[: -len(".py")].split("/")
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            if any(part.startswith("_") for part in parts):
                continue
            tree = ast.parse(archive.read(path), filename=path)
            modules[".".join(parts)] = _public_names(tree, is_package)
    return version, dict(sorted(modules.items()))


# --- what this checkout does with each ----------------------------------------------------


@dataclass(frozen=True)
class State:
    """A module's or name's state here: "works" with its tests, or "refused" with why."""

    works: bool
    detail: str  # the tests that name it, or the reason it is refused


def _reason(error: BaseException) -> str:
    return " ".join(str(error).split())


def module_state(module: str, tests: dict[str, list[str]]) -> State:
    try:
        importlib.import_module(module)
    except ImportError as error:
        return State(False, _reason(error))
    named = tests.get(module, [])
    if module == "art" and _PUBLIC_API_TEST in named:
        named = [_PUBLIC_API_TEST]  # every test names `art`: this one is the package's own
    # Three at most, and no count of the rest, so that a new test elsewhere leaves the page.
    return State(bool(named), ", ".join(named[:3]) or "imports, but no test names it")


def name_state(module: str, name: str) -> State:
    try:
        value = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        return State(False, _reason(error))
    # art.core.data.not_built's placeholders carry the reason they give when used.
    refusal = getattr(value, "__art_refused__", None)
    return State(True, "") if refusal is None else State(False, str(refusal))


def tests_naming(modules: list[str]) -> dict[str, list[str]]:
    """For each module, the test files whose text names it: dotted, or imported from its
    package on one line (`from art.utils import cache_dirs`)."""
    texts = {
        path.relative_to(ROOT).as_posix(): path.read_text()
        for path in sorted(TESTS.rglob("test_*.py"))
        if path.name != "test_art_names.py"
    }
    named: dict[str, list[str]] = {}
    for module in modules:
        parent, _, leaf = module.rpartition(".")
        dotted = rf"(?<![\w.]){re.escape(module)}(?![\w])"
        imported = rf"from {re.escape(parent)} import [^\n]*\b{re.escape(leaf)}\b"
        pattern = re.compile(f"{dotted}|{imported}")
        # Either form holds the module's last part: a substring test first skips most
        # files, where the pattern's search through every file took ~20 s for both lists.
        named[module] = [
            path for path, text in texts.items() if leaf in text and pattern.search(text)
        ]
    return named


def load(version: str) -> dict[str, list[str]]:
    data: dict[str, Any] = json.loads((DATA / f"{version}.json").read_text())
    return data["modules"]  # type: ignore[no-any-return]


def versions() -> list[str]:
    return sorted((path.stem for path in DATA.glob("*.json")), key=_version_key)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def render_table() -> str:
    """The markdown page: one section per ART version, a row per module, its names."""
    lists = {version: load(version) for version in versions()}
    all_modules = sorted({module for modules in lists.values() for module in modules})
    tests = tests_naming(all_modules)
    states = {module: module_state(module, tests) for module in all_modules}
    lines = [
        "# Every public module and name of ART",
        "",
        "Generated by `python scripts/art_names.py table` from the module and name lists of",
        "OpenPipe ART's wheels (" + ", ".join(lists) + "), walked by",
        "`scripts/art_names.py walk` and checked in under `tests/data/art_names/`; each",
        "module is imported and each name looked up in this checkout.",
        "`tests/test_art_names.py` fails when this page is out of date or when a module or name",
        'is neither "works" nor "refused". A module "works" when it imports and a test names',
        "it (listed); a name works when it is there and is not a refusal. A refusal is what",
        "you get when you import or use it: the reason, and what to use instead.",
        "",
    ]
    for version, modules in lists.items():
        works = sum(states[module].works for module in modules)
        lines += [
            f"## ART {version}",
            "",
            f"{len(modules)} public modules: {works} work here, {len(modules) - works} refused.",
            "",
            "| module | state | names |",
            "|---|---|---|",
        ]
        for module, names in modules.items():
            state = states[module]
            cell = _names_cell(module, names) if state.works else f"{len(names)} names"
            verdict = f"works ({state.detail})" if state.works else f"refused: {state.detail}"
            lines.append(f"| `{module}` | {_escape(verdict)} | {cell} |")
        lines.append("")
    return "\n".join(lines)


def _names_cell(module: str, names: list[str]) -> str:
    parts = []
    for name in names:
        state = name_state(module, name)
        parts.append(f"`{name}`" if state.works else f"`{name}` (refused: {state.detail})")
    return _escape("; ".join(parts)) or "none"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def problems() -> list[str]:
    """Modules and names that are neither working (with a test) nor refused with a reason."""
    found: list[str] = []
    for version in versions():
        modules = load(version)
        tests = tests_naming(list(modules))
        for module, names in modules.items():
            state = module_state(module, tests)
            if not state.works:
                if "is not built here" not in state.detail:
                    found.append(f"{version} {module}: {state.detail}")
                continue
            for name in names:
                name_value = name_state(module, name)
                if not name_value.works and not name_value.detail:
                    found.append(f"{version} {module}.{name}: refused with no reason")
                elif not name_value.works and "has no attribute" in name_value.detail:
                    found.append(f"{version} {module}.{name}: missing")
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    walk = commands.add_parser("walk", help="write the name lists of ART's wheels")
    walk.add_argument("wheels", nargs="+", type=Path)
    commands.add_parser("table", help=f"write {TABLE.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    if args.command == "walk":
        DATA.mkdir(parents=True, exist_ok=True)
        for wheel in args.wheels:
            version, modules = walk_wheel(wheel)
            out = DATA / f"{version}.json"
            data = {"wheel": wheel.name, "modules": modules}
            out.write_text(json.dumps(data, indent=1) + "\n")
            print(f"{out.relative_to(ROOT)}: {len(modules)} modules", file=sys.stderr)
    else:
        TABLE.write_text(render_table())
        print(f"wrote {TABLE.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
