"""ART's `art.gather` import path."""

from typing import Any

from .core.gather import gather_trajectories, gather_trajectory_groups
from ._refusals import refused_name


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = ["gather_trajectories", "gather_trajectory_groups"]
