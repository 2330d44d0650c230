"""ART's `art.utils` import path."""

from .core.utils import DatasetBatch, iterate_dataset, limit_concurrency, retry

__all__ = ["DatasetBatch", "iterate_dataset", "limit_concurrency", "retry"]
