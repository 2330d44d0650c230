"""ART's `art.utils.benchmarking.filter_model_split` import path (`art.analysis.tables`)."""

from ...analysis.tables import filter_rename_model_split

__all__ = ["filter_rename_model_split"]
