"""ART's `art.utils.benchmarking.aggregate_trajectories` import path (`art.analysis.tables`)."""

from ...analysis.tables import load_aggregated_trajectories, load_latest_metrics

__all__ = ["load_aggregated_trajectories", "load_latest_metrics"]
