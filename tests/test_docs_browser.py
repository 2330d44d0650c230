"""The documentation site in a real browser: headless Chromium, as tests/viewer/test_viewer.py.

The site is built strictly and served on 127.0.0.1 (Material's search loads its index over
HTTP); the home page and one guide are opened, their navigation checked and a screenshot
of each kept in `.art/screens/`. Without Debian's `chromium` the browser checks skip and
say why; the search index is checked either way.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_docs import REPO, mkdocs_build

SCREENS = REPO / ".art" / "screens"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    result = mkdocs_build(REPO, target)
    assert result.returncode == 0, result.stderr[-4000:]
    return target


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip(
            "no chromium on PATH: the site's browser checks need Debian's `chromium` "
            "(make test installs it with apt-get when run as root)"
        )
    return found


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The built site over HTTP on 127.0.0.1 (search loads its index with fetch)."""
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()
    server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def browser(*options: str, profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            chromium(),
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=10000",
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


def test_the_search_index_holds_every_page(site: Path) -> None:
    """mkdocs' offline search: the index the search box's worker loads, built with the site
    (no service is asked). Every page of the navigation is in it by its title."""
    index = json.loads((site / "search" / "search_index.json").read_text())
    titles = {doc["title"] for doc in index["docs"]}
    assert {"Getting started", "Train your LangGraph agent", "Coming from ART"} <= titles
    assert any("PipelineTrainer" in doc["text"] for doc in index["docs"])
    home = (site / "index.html").read_text()
    assert re.search(r'"search": "assets/javascripts/workers/search\.[0-9a-f]+\.min\.js"', home)


@pytest.mark.parametrize(
    ("path", "name", "title"),
    [
        ("", "docs-home.png", "Getting started"),
        ("guides/langgraph/", "docs-langgraph.png", "Train your LangGraph agent"),
    ],
)
def test_a_page_renders_with_navigation_in_chromium(
    served: str, tmp_path: Path, path: str, name: str, title: str
) -> None:
    url = f"{served}/{path}"
    dom = browser("--dump-dom", url, profile=tmp_path / "profile").stdout
    assert "<h1" in dom
    assert title in dom
    nav = re.search(
        r'<nav class="md-nav md-nav--primary".*?</nav>\s*</div>\s*</div>\s*</div>', dom, re.S
    )
    assert nav is not None, f"no primary navigation on {url}"
    nav_text = nav.group(0)
    for entry in ("Concepts", "Guides", "Coming from ART", "API", "Benchmarks"):
        assert entry in nav_text, f"{entry} not in the navigation of {url}"
    assert 'class="md-search"' in dom  # the search box
    SCREENS.mkdir(parents=True, exist_ok=True)
    target = SCREENS / name
    target.unlink(missing_ok=True)
    browser(
        "--hide-scrollbars",
        f"--screenshot={target}",
        "--window-size=1280,900",
        url,
        profile=tmp_path / "profile",
    )
    assert target.stat().st_size > 20_000  # a rendered page, not a blank one
    print(f"docs screenshot: {target}")
