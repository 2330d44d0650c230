"""ART's `art.utils.old_benchmarking.types` import path (`art.analysis.benchmarked_models`)."""

from ...analysis.benchmarked_models import (
    BenchmarkedModel,
    BenchmarkedModelKey,
    BenchmarkedModelStep,
)

__all__ = ["BenchmarkedModel", "BenchmarkedModelKey", "BenchmarkedModelStep"]
