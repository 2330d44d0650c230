"""ART's `art.utils.old_benchmarking.calculate_step_metrics` import path (`art.analysis.benchmarked_models`)."""

from ...analysis.benchmarked_models import calculate_step_std_dev

__all__ = ["calculate_step_std_dev"]
