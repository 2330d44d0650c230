"""Assemble the single offline HTML file: our CSS and JS inline, the run's data as JSON.

The data sits in a `<script type="application/json">` element, parsed once by the page's
script, which builds only what is on screen (one model's curves, one step's groups, one
group's trajectories). Nothing is fetched: the file works from a disk with no network.
"""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from .. import __version__


def _asset(name: str) -> str:
    return (resources.files("art.viewer") / "static" / name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """`data` as JSON that cannot end its `<script>` element early.

    `<` is written as its escape `\\u003c`, so neither `</script>` nor `<!--` can appear
    inside; JSON.parse reads the escape back as `<`.
    """
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def render_page(data: dict[str, Any]) -> str:
    """The whole page for a project's data as `read_project` returns it."""
    page_data = {
        **data,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "art_version": __version__,
    }
    title = html.escape(f"art: {data['project']}")
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{_asset("viewer.css")}
</style>
</head>
<body>
<div id="app"><noscript>This page draws the run with JavaScript; turn it on to see it.</noscript></div>
<script type="application/json" id="art-data">{embed_json(page_data)}</script>
<script>
{_asset("viewer.js")}
</script>
</body>
</html>
"""
