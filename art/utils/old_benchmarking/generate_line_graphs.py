"""ART's `art.utils.old_benchmarking.generate_line_graphs` import path (`art.analysis.benchmarked_models`)."""

from ...analysis.benchmarked_models import generate_line_graphs

__all__ = ["generate_line_graphs"]
