"""ART's `art.utils.benchmarking.charts` import path (`art.analysis.charts`)."""

from ....analysis.charts import percentage_comparison_bar_chart, training_progress_chart

__all__ = ["percentage_comparison_bar_chart", "training_progress_chart"]
