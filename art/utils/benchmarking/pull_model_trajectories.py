"""ART's `art.utils.benchmarking.pull_model_trajectories` import path (`art.analysis.pull`)."""

from ...analysis.pull import pull_model_trajectories

__all__ = ["pull_model_trajectories"]
