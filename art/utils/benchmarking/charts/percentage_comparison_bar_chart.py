"""ART's `art.utils.benchmarking.charts.percentage_comparison_bar_chart` import path."""

from ....analysis.charts import percentage_comparison_bar_chart

__all__ = ["percentage_comparison_bar_chart"]
