"""ART's `art.utils.benchmarking.load_trajectories` import path (`art.analysis.tables`).

The table is a `pyarrow.Table` with the columns of ART's polars DataFrame;
`polars.from_arrow(table)` gives that DataFrame where polars is installed.
"""

from pathlib import Path

from ...analysis.tables import load_trajectories

cache_path = Path("data") / "cache.db"
"""ART's DuckDB cache file, relative to the repository root. ART's loader never reads or
writes it, and neither does this one: kept so code importing it still imports."""

__all__ = ["cache_path", "load_trajectories"]
