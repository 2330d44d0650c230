"""ART's `art.utils.iterate_dataset` module path."""

from ..core.utils import DatasetBatch, iterate_dataset

__all__ = ["DatasetBatch", "iterate_dataset"]
