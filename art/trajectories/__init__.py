"""ART's `art.trajectories` import path."""

from .core.trajectories import (
    History,
    MetadataValue,
    PydanticException,
    Trajectory,
    TrajectoryGroup,
)

__all__ = ["History", "MetadataValue", "PydanticException", "Trajectory", "TrajectoryGroup"]
