"""The local run viewer: one static HTML page of a project's runs, readable offline.

    path = art.viewer.write_page("./.art", project="my-task")   # or: art show ./.art

The page shows, for each model of the project, every metric of `history.jsonl` per step
as a curve (rewards first), and a browser of the logged trajectories per split and step:
each group's best and worst rollouts side by side (messages, tool calls and results,
reward, metrics, metadata, logs with RULER's explanations) and its failed rollouts with
their tracebacks. It reads only what the run wrote, and draws only the selected step, so
runs of thousands of trajectories stay responsive.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.store.atomic import write_text_atomic
from ._page import render_page
from ._read import RunLocation, locate, read_project

DEFAULT_PAGE_NAME = "viewer.html"


def build_page(path: str | os.PathLike[str] = "./.art", project: str | None = None) -> str:
    """The page's HTML for the project under `path` (see `locate` for what `path` may be)."""
    return render_page(read_project(locate(path, project)))


def write_page(
    path: str | os.PathLike[str] = "./.art",
    project: str | None = None,
    out: str | os.PathLike[str] | None = None,
) -> Path:
    """Write the page atomically to `out` (default `<path>/<project>/viewer.html`).

    The page gets the mode any new file of the user gets (0644 under the usual umask 022).
    """
    location = locate(path, project)
    target = (
        Path(out) if out is not None else location.base_path / location.project / DEFAULT_PAGE_NAME
    )
    page = render_page(read_project(location))
    write_text_atomic(target, page)
    return target


__all__ = ["DEFAULT_PAGE_NAME", "RunLocation", "build_page", "locate", "read_project", "write_page"]
