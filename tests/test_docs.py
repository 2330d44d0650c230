"""The documentation site (`docs/`, `mkdocs.yml`): built strictly, and every code block runs.

Each fenced block on the site is one of three kinds:
- an include (`--8<-- "path"` or `"path:section"`) of a file a test runs: a snippet under
  `docs/snippets/`, which the tests here execute, or an example under `examples/`, which a
  test of its own runs (tests/test_examples.py: each trains what its rewards tell apart);
- a block preceded by `<!-- not run: why -->`, which says why it is not run (shell
  commands, a directory listing, the shape of a call);
- nothing else: a bare block fails `test_every_code_block_is_included_or_marked`.

The site in a real browser is tests/test_docs_browser.py.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import assert_trained_the_groups_told_apart
from openai.types.chat.chat_completion import Choice

import art

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
SNIPPETS = DOCS / "snippets"
FENCE = re.compile(
    r"^(?P<indent> *)(?P<fence>```+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence) *$",
    re.M | re.S,
)
INCLUDE = re.compile(r'^\s*--8<-- "(?P<path>[^":]+)(?::(?P<section>[\w-]+))?"\s*$')
NOT_RUN = re.compile(r"<!-- not run: [^>]+ -->\s*$")
ENV = os.environ | {"NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)}


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if SNIPPETS not in p.parents)


def blocks(page: Path) -> Iterator[tuple[int, str, str]]:
    """(line, text before the block, body) for each fenced code block of `page`."""
    text = page.read_text()
    for match in FENCE.finditer(text):
        before = text[: match.start()]
        yield before.count("\n") + 1, before.rstrip(" "), match.group("body")


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built strictly from this checkout."""
    target = tmp_path_factory.mktemp("site")
    result = mkdocs_build(REPO, target)
    assert result.returncode == 0, result.stderr[-4000:]
    return target


def copy_of_the_docs(tmp_path: Path) -> Path:
    """A copy of the site's sources to break: docs/ and mkdocs.yml copied, the rest linked."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copytree(DOCS, root / "docs")
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    for name in ("art", "examples", "benchmarks"):
        (root / name).symlink_to(REPO / name)
    return root


# --- the API reference ---------------------------------------------------------------


def test_every_public_name_has_a_docstring() -> None:
    """What the reference shows is what griffe (mkdocstrings' reader) finds: a type alias's
    docstring is the string literal under it, as the site renders it."""
    import griffe

    package = griffe.load(
        "art", search_paths=[str(REPO)], resolve_aliases=True, try_relative_path=False
    )
    missing = [
        name
        for name in art.__all__
        if package[name].docstring is None or not package[name].docstring.value.strip()
    ]
    assert not missing, f"public names without a docstring: {missing}"


def test_the_api_reference_lists_every_public_name() -> None:
    text = (DOCS / "reference" / "api.md").read_text()
    listed = set(re.findall(r"^::: art\.(\w+)\s*$", text, re.M))
    assert listed >= set(art.__all__), f"not in the reference: {set(art.__all__) - listed}"


def test_the_built_reference_renders_each_public_name(site: Path) -> None:
    page = (site / "reference" / "api" / "index.html").read_text()
    missing = [name for name in art.__all__ if f'id="art.{name}"' not in page]
    assert not missing, f"the built reference has no entry for {missing}"
    # The docstring itself is on the page, not only the heading.
    assert "A model a backend serves and trains with GRPO on LoRA adapters" in page


# --- code blocks that cannot rot ---------------------------------------------------------


def named_by_a_test(path: str) -> bool:
    """Whether a test file other than this one names the example `path` (and so runs it)."""
    name = Path(path).name
    return any(
        name in test.read_text()
        for test in (REPO / "tests").rglob("test_*.py")
        if test.name != Path(__file__).name
    )


def test_every_code_block_is_included_or_marked() -> None:
    bare, untested = [], []
    for page in pages():
        for line, before, body in blocks(page):
            where = f"{page.relative_to(REPO)}:{line}"
            includes = [INCLUDE.match(row) for row in body.splitlines() if row.strip()]
            if includes and all(includes):
                for include in includes:
                    assert include is not None
                    path = include.group("path")
                    if path.startswith("examples/"):
                        if not named_by_a_test(path):
                            untested.append(f"{where}: {path}")
                    elif not path.startswith("docs/snippets/"):
                        untested.append(f"{where}: {path} is run by no test")
            elif not NOT_RUN.search(before):
                bare.append(where)
    assert not bare, (
        "code blocks neither included from a tested file nor marked "
        f"`<!-- not run: why -->` on the line before: {bare}"
    )
    assert not untested, f"included files no test runs: {untested}"


def test_the_checker_catches_a_bare_block(tmp_path: Path) -> None:
    """The classification above, on a page with one block of each kind."""
    page = tmp_path / "page.md"
    page.write_text(
        'Text.\n\n```python\n--8<-- "docs/snippets/loop.py"\n```\n\n'
        "<!-- not run: a listing -->\n```text\nart/\n```\n\n"
        "```python\nprint('bare')\n```\n"
    )
    found = [(NOT_RUN.search(before) is not None, body) for _, before, body in blocks(page)]
    assert found == [
        (False, '--8<-- "docs/snippets/loop.py"\n'),
        (True, "art/\n"),
        (False, "print('bare')\n"),
    ]
    assert INCLUDE.match(found[0][1].strip())
    assert not INCLUDE.match(found[2][1].strip())


def run_snippet(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a snippet as a module (what sits under `if __name__ == "__main__"` would train
    or reach a network, and is left out), in `cwd`, offline."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            f"import runpy; runpy.run_path({str(path)!r}, run_name='docs_snippet')",
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV | {"WANDB_MODE": "offline", "WEAVE_DISABLED": "true"},
    )


@pytest.mark.model
@pytest.mark.parametrize("snippet", sorted(p.name for p in SNIPPETS.glob("*.py")))
def test_each_snippet_runs(snippet: str, tmp_path: Path) -> None:
    result = run_snippet(SNIPPETS / snippet, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (tmp_path / ".art").exists(), "a snippet wrote a run where it was started"


def test_a_broken_snippet_fails_its_run(tmp_path: Path) -> None:
    """A snippet whose API call went stale (here a keyword `TrainConfig` never had) fails
    the run above, so the page that includes it cannot go on showing it."""
    broken = tmp_path / "loop.py"
    broken.write_text(
        (SNIPPETS / "loop.py").read_text()
        + "\nart.TrainConfig(learning_rate=1e-5, no_such_option=True)\n"
    )
    result = run_snippet(broken, tmp_path)
    assert result.returncode != 0
    assert "no_such_option" in result.stderr


@pytest.mark.parametrize(
    ("snippet", "run"),
    [("readme_example.py", "demo/models/agent"), ("loop.py", "my-task/models/agent-001")],
)
@pytest.mark.model
def test_the_loops_shown_train_a_step(snippet: str, run: str, tmp_path: Path) -> None:
    """The README's loop and the getting-started template, their `main` run where a user
    would start them: one step, which trains exactly the groups whose rewards differ. (Their
    rewards rank answers of the same credit by length, so a group all worth 0.5 is rare; it
    came out twice in a row once, a loop that trains nothing, and may again on a draw.)"""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import asyncio, runpy; asyncio.run(runpy.run_path("
            f"{str(SNIPPETS / snippet)!r}, run_name='docs_snippet')['main'](steps=1))",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert_trained_the_groups_told_apart(tmp_path / ".art" / run)


def test_every_snippet_is_shown_on_the_site() -> None:
    shown = {
        Path(include.group("path")).name
        for page in pages()
        for _, _, body in blocks(page)
        for row in body.splitlines()
        if (include := INCLUDE.match(row))
    }
    readme_only = {"readme_example.py"}
    unused = {p.name for p in SNIPPETS.glob("*.py")} - shown - readme_only
    assert not unused, f"snippets no page includes: {unused}"


def test_the_readme_example_is_the_snippet_the_tests_run() -> None:
    readme = (REPO / "README.md").read_text()
    example = (SNIPPETS / "readme_example.py").read_text()
    assert f"```python\n{example}```" in readme
    ast.parse(example)


@pytest.mark.model
def test_the_langgraph_recipe_is_its_example_and_its_rollout_is_recorded(
    tmp_path: Path,
) -> None:
    """One group of the LangGraph guide's rollout, as the example wraps it, on the default
    model: what the graph's calls recorded (tests/test_examples.py trains the example)."""
    spec = importlib.util.spec_from_file_location(
        "langgraph_agent", REPO / "examples" / "langgraph_agent.py"
    )
    assert spec is not None
    assert spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    from art.langgraph import wrap_rollout
    from art.local import LocalBackend

    async def one_group() -> art.TrajectoryGroup:
        backend = LocalBackend(path=tmp_path / ".art", in_process=True)
        model = art.TrainableModel(
            name="capitals-agent", project="docs", base_model=example.BASE_MODEL
        )
        await model.register(backend)
        try:
            groups = await art.gather_trajectory_groups(
                [
                    art.TrajectoryGroup(
                        wrap_rollout(model, example.rollout)("France") for _ in range(2)
                    )
                ]
            )
        finally:
            await backend.close()
        return groups[0]

    import asyncio

    group = asyncio.run(one_group())
    assert len(group.trajectories) == 2
    for trajectory in group.trajectories:
        assert trajectory.reward in (0.0, 0.5, 1.0)
        # The graph's calls were recorded as trainable turns: Choices with their token ids.
        sampled = [
            item
            for item in trajectory.messages_and_choices
            if isinstance(item, Choice) and (item.model_extra or {}).get("token_ids")
        ]
        assert sampled, trajectory.messages()
        # The first turn was forced to the tool (its call can still be cut at max_tokens).
        first = trajectory.messages()[2]
        assert first["role"] == "assistant", first
        assert "lookup_capital" in json.dumps(first), first


# --- the strict build ----------------------------------------------------------------------


def test_the_site_builds_strictly(site: Path) -> None:
    for page in ("index.html", "guides/mcp/index.html", "coming-from-art/index.html"):
        assert (site / page).is_file()
    # Includes were expanded: the example's own code is on the page, no marker left.
    mcp = (site / "guides" / "mcp" / "index.html").read_text()
    assert "fresh_sessions" in mcp
    assert "--8&lt;--" not in mcp
    assert "--8<--" not in mcp


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    root = copy_of_the_docs(tmp_path)
    page = root / "docs" / "concepts.md"
    page.write_text(page.read_text() + "\nSee [nowhere](guides/no-such-page.md).\n")
    result = mkdocs_build(root, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr


def test_a_broken_snippet_include_fails_the_strict_build(tmp_path: Path) -> None:
    root = copy_of_the_docs(tmp_path)
    page = root / "docs" / "guides" / "pipeline.md"
    page.write_text(
        page.read_text() + '\n```python\n--8<-- "examples/pipeline.py:no-such-section"\n```\n'
    )
    result = mkdocs_build(root, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-section" in result.stderr


def test_a_public_name_without_a_docstring_fails_the_check(tmp_path: Path) -> None:
    """The docstring check, on a copy of `art` with one docstring removed."""
    import griffe

    copy = tmp_path / "art"
    shutil.copytree(REPO / "art", copy)
    types = copy / "core" / "data" / "types.py"
    text = types.read_text()
    stripped = re.sub(
        r'^Tools: TypeAlias = list\[Tool\]\n"""[^\n]*"""\n',
        "Tools: TypeAlias = list[Tool]\n",
        text,
        flags=re.M,
    )
    assert stripped != text
    types.write_text(stripped)
    package = griffe.load(
        "art", search_paths=[str(tmp_path)], resolve_aliases=True, try_relative_path=False
    )
    assert package["Tools"].docstring is None
    assert package["Tool"].docstring is not None


# --- coming from ART, and the README -------------------------------------------------------


def test_coming_from_art_names_every_keyword_refused() -> None:
    from art.core.data.train_options import NOT_BUILT

    page = (DOCS / "coming-from-art.md").read_text()
    missing = [keyword for keyword in NOT_BUILT if f"`{keyword}`" not in page]
    assert not missing, f"refused keywords the page does not name: {missing}"


def test_the_readme_is_one_screen_or_two_and_links_into_the_site() -> None:
    readme = (REPO / "README.md").read_text()
    lines = readme.splitlines()
    assert len(lines) <= 150, len(lines)
    first_screen = "\n".join(lines[:30])
    assert "make demo" in first_screen
    assert "make test" in first_screen
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert links, "the README links into no page of the site"
    missing = [link for link in links if not (REPO / link).is_file()]
    assert not missing, missing
