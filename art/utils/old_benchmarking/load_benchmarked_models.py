"""ART's `art.utils.old_benchmarking.load_benchmarked_models` import path (`art.analysis.benchmarked_models`)."""

from ...analysis.benchmarked_models import load_benchmarked_models

__all__ = ["load_benchmarked_models"]
