"""ART's `art.gather` import path."""

from .core.gather import gather_trajectories, gather_trajectory_groups

__all__ = ["gather_trajectories", "gather_trajectory_groups"]
