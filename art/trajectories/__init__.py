"""ART's `art.trajectories` import path."""

from typing import Any

from .._refusals import refused_name
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
    "get_messages",
]
