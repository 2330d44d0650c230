"""Analysis of logged runs: trajectory tables, per-step aggregates and comparison charts.

    table = await load_trajectories("my-task", art_path="./.art")
    steps = await load_aggregated_trajectories("my-task")
    figure = training_progress_chart(table, "reward")
    figure.savefig("reward.png")

This room reads only what a run wrote under `<path>/<project>/models/<name>/` (through
`core`'s model store and Parquet reader) and never trains, serves or logs. Tables are
`pyarrow.Table`s, with the columns ART's polars DataFrames have: `polars.from_arrow(table)`
or `table.to_pandas()` turns one into either library's frame where it is installed.
Charts are matplotlib `Figure`s drawn without pyplot, so no global backend is chosen
and nothing is left open. ART's import paths (`art.utils.benchmarking.*`,
`art.utils.old_benchmarking.*`, `art.utils.benchmark_rollout`) re-export from here.
"""

from .charts import percentage_comparison_bar_chart, training_progress_chart
from .rollout import benchmark_rollout
from .tables import (
    BenchmarkModelKey,
    filter_rename_model_split,
    load_aggregated_trajectories,
    load_latest_metrics,
    load_trajectories,
)

__all__ = [
    "BenchmarkModelKey",
    "benchmark_rollout",
    "filter_rename_model_split",
    "load_aggregated_trajectories",
    "load_latest_metrics",
    "load_trajectories",
    "percentage_comparison_bar_chart",
    "training_progress_chart",
]
