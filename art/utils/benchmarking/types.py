"""ART's `art.utils.benchmarking.types` import path (`art.analysis.tables`)."""

from ...analysis.tables import BenchmarkModelKey

__all__ = ["BenchmarkModelKey"]
