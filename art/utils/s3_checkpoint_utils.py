"""ART's `art.utils.s3_checkpoint_utils` module path: checkpoint steps stored in S3, read
from the bucket's listing (`art.core.store.s3`)."""

from ..core.store.s3 import (
    get_checkpoint_step_not_after_from_s3,
    get_latest_checkpoint_step_from_s3,
    migrate_s3_checkpoints_to_new_structure,
)

__all__ = [
    "get_checkpoint_step_not_after_from_s3",
    "get_latest_checkpoint_step_from_s3",
    "migrate_s3_checkpoints_to_new_structure",
]
