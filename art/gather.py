"""ART's `art.gather` import path."""

from typing import Any

from ._refusals import refused_name
from .core.gather import gather_trajectories, gather_trajectory_groups


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = ["gather_trajectories", "gather_trajectory_groups"]
