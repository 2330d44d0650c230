"""ART's `art.trajectories` import path."""

from typing import Any

from .._refusals import refused_name
from ..core.capture_scope import current_trajectory, no_capture, trajectory, trajectory_group
from ..core.trajectories import (
    History,
    MetadataValue,
    PydanticException,
    Trajectory,
    TrajectoryGroup,
)
from ..core.trajectories import messages_of as get_messages


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = [
    "History",
    "MetadataValue",
    "PydanticException",
    "Trajectory",
    "TrajectoryGroup",
    "current_trajectory",
    "get_messages",
    "no_capture",
    "trajectory",
    "trajectory_group",
]
