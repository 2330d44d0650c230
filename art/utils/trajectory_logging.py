"""ART's `art.utils.trajectory_logging`: trajectory groups to and from Parquet.

    write_trajectory_groups_parquet(groups, "step.parquet")
    groups = read_trajectory_groups_parquet("step.parquet")

The reader opens our files (a model's `trajectories/{split}/{step:04d}.parquet`) and the
files of ART 0.5.18 and 0.5.23; see `art.core.store.parquet` and `art.core.store.art_parquet`.
"""

from ..core.store.parquet import read_trajectory_groups_parquet, write_trajectory_groups_parquet

__all__ = ["read_trajectory_groups_parquet", "write_trajectory_groups_parquet"]
