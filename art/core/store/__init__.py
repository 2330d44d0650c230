"""Storage: atomic writes, the writer lock, a model's directory (`ModelStore`: checkpoints,
history, trajectories), Parquet, and S3.

Imports the data model and the metric names a history row is written under
(`art.core.metrics`).
"""
