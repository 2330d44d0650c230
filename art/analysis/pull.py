"""A model's logged trajectories pulled from S3, for analysis on another machine."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..core.data.errors import ConfigError
from ..core.store.s3 import pull_model_from_s3

if TYPE_CHECKING:
    from ..core.model import Model


async def pull_model_trajectories(model: Model) -> None:
    """Download `model`'s directory from the `BACKUP_BUCKET` S3 bucket, without its
    checkpoints and logs, into ART's default art path (`.art` at the root of the git
    repository around the working directory), where `load_trajectories` reads it.

    Uses `art.utils.s3` (boto3; `AWS_*` settings, `AWS_ENDPOINT_URL` for an S3-compatible
    server). A failed pull changes nothing locally.
    """
    bucket = os.environ.get("BACKUP_BUCKET")
    if not bucket:
        raise ConfigError(
            "BACKUP_BUCKET",
            "the environment variable naming the bucket to pull from is not set",
            "Set BACKUP_BUCKET to the bucket the model was pushed to (push_model_to_s3)",
        )
    print(f"Pulling trajectories for model '{model.name}' from S3 bucket '{bucket}'…", flush=True)
    await pull_model_from_s3(
        model_name=model.name,
        project=model.project,
        s3_bucket=bucket,
        verbose=True,
        exclude=["checkpoints", "logs"],
    )
    print("Finished pulling trajectories.", flush=True)


__all__ = ["pull_model_trajectories"]
