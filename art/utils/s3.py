"""ART's `art.utils.s3` module path: model directories pushed to and pulled from S3
(`art.core.store.s3`, through boto3 instead of ART's `aws` CLI). A push publishes each checkpoint
only when complete, and readers take only published ones (`art.core.store.s3_publish`)."""

from ..core.store.s3 import (
    ExcludableOption,
    S3SyncError,
    archive_and_presign_step_url,
    build_s3_path,
    build_s3_zipped_step_path,
    ensure_bucket_exists,
    pull_model_from_s3,
    push_model_to_s3,
    s3_sync,
)
from ..core.store.s3_publish import UnpublishedCheckpointWarning

__all__ = [
    "ExcludableOption",
    "S3SyncError",
    "UnpublishedCheckpointWarning",
    "archive_and_presign_step_url",
    "build_s3_path",
    "build_s3_zipped_step_path",
    "ensure_bucket_exists",
    "pull_model_from_s3",
    "push_model_to_s3",
    "s3_sync",
]
