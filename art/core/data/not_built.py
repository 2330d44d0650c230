"""Placeholders for public names whose capability is not built yet.

Each one raises `NotBuiltError` (a NotImplementedError) naming what is missing the
moment it is used, never returning a silent default.
"""

from __future__ import annotations

from typing import Any, NoReturn

from .errors import NotBuiltError


def not_built_function(name: str, missing: str) -> Any:
    """A function called `name` that raises `NotBuiltError(name, missing)` when called."""

    def placeholder(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotBuiltError(name, missing)

    placeholder.__name__ = name.rsplit(".", 1)[-1]
    placeholder.__qualname__ = placeholder.__name__
    placeholder.__doc__ = f"Not available yet: {missing}"
    placeholder.__art_refused__ = missing  # type: ignore[attr-defined]  # for the names table
    return placeholder


def not_built_class(name: str, missing: str) -> Any:
    """A class called `name` whose construction raises `NotBuiltError(name, missing)`."""

    def __init__(self: object, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotBuiltError(name, missing)

    short = name.rsplit(".", 1)[-1]
    namespace = {"__init__": __init__, "__doc__": f"Not available yet: {missing}"}
    return type(short, (), {**namespace, "__art_refused__": missing})


trajectory_group_batches = not_built_function(
    "art.trajectory_group_batches",
    "gather each step's groups with `await art.gather_trajectory_groups(...)` "
    "(rollouts of a step run concurrently), then `await model.train(groups)`",
)
"""ART's batching helper, not built here: raises `NotBuiltError` naming what to use instead."""
