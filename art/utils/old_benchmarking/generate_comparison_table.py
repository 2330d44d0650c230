"""ART's `art.utils.old_benchmarking.generate_comparison_table` import path (`art.analysis.benchmarked_models`)."""

from ...analysis.benchmarked_models import generate_comparison_table

__all__ = ["generate_comparison_table"]
