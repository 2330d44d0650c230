"""ART's `art.utils.benchmarking.charts.training_progress_chart` import path."""

from ....analysis.charts import training_progress_chart

__all__ = ["training_progress_chart"]
