"""Model directories mirrored to S3 or an S3-compatible server (ART's `art.utils.s3`):
pulls, pushes, zipped steps, the stored steps, forks and ART's old-layout migration.

The client, errors and key layout are `art.core.store.s3_client`'s; copying is
`art.core.store.s3_sync`'s (`aws s3 sync`'s rule, atomic pulls); a push publishes each
checkpoint only when complete (`art.core.store.s3_publish`).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from ..data.errors import ConfigError
from .s3_client import (
    ForbiddenBucketCreationError,
    S3Error,
    S3SyncError,
    boto_errors,
    build_s3_path,
    build_s3_zipped_step_path,
    client,
    ensure_bucket,
    ensure_bucket_exists,
    model_dir,
    require_bucket,
    resolve_bucket,
    s3_error,
    split_uri,
)
from .s3_publish import (
    mark_migrated,
    push_published,
    split_published,
    unpublished_error,
    warn_unpublished,
)
from .s3_sync import (
    ExcludableOption,
    check_exclude,
    copy_within_s3,
    delete_keys,
    download,
    keep_filter,
    list_s3,
    list_step_prefixes,
    s3_sync,
    sync,
    upload,
)

_PRESIGN_SECONDS = 3600


async def pull_model_from_s3(
    model_name: str,
    project: str,
    step: int | None = None,
    s3_bucket: str | None = None,
    prefix: str | None = None,
    verbose: bool = False,
    delete: bool = False,
    art_path: str | None = None,
    exclude: list[ExcludableOption] | None = None,
) -> str:
    """Download a model's directory (or only its checkpoint `step`) from S3 into
    `art_path`; returns the local model directory.

    Args:
        model_name: the model's name.
        project: the model's project.
        step: only this checkpoint; None: everything stored for the model.
        s3_bucket: the bucket (None: `BACKUP_BUCKET`).
        prefix: the key prefix the model was pushed under.
        verbose: print each download.
        delete: also delete local files the bucket does not hold (within what is pulled).
        art_path: the backend's path (None: `LocalBackend()`'s, `./.art`).
        exclude: top-level folders to leave out ("checkpoints", "logs", "trajectories").

    Raises:
        S3SyncError: the bucket is missing, nothing is stored there for the model (or
            `step`), the credentials were refused, or a download failed. Nothing
            is changed locally then.
    """
    patterns = check_exclude(exclude)
    uri = build_s3_path(
        model_name=model_name, project=project, step=step, s3_bucket=s3_bucket, prefix=prefix
    )
    local_model = model_dir(project, model_name, art_path)
    local = local_model / "checkpoints" / f"{step:04d}" if step is not None else local_model
    model_uri = build_s3_path(
        model_name=model_name, project=project, s3_bucket=s3_bucket, prefix=prefix
    )
    bucket, model_key = split_uri(model_uri)
    s3 = client()

    def published_only() -> Callable[[str], bool]:
        """The filter of what to pull: unpublished checkpoints left out (and warned of)."""
        require_bucket(s3, bucket)
        if step is not None:
            stored = list_s3(s3, bucket, f"{model_key}/checkpoints/{step:04d}")
            if stored and not split_published(s3, bucket, model_key, [step])[0]:
                raise unpublished_error(model_uri, step, bucket, model_key)
            return keep_filter(patterns, skip_hidden=True)
        steps = list_step_prefixes(s3, bucket, f"{model_key}/checkpoints")
        skipped[:] = split_published(s3, bucket, model_key, steps)[1]
        left_out = [f"checkpoints/{s:04d}/*" for s in skipped]
        return keep_filter([*patterns, *left_out], skip_hidden=True)

    skipped: list[int] = []
    keep = await asyncio.to_thread(published_only)
    if skipped:
        warn_unpublished(model_uri, skipped)
    await asyncio.to_thread(
        sync, uri, str(local), s3=s3, verbose=verbose, delete=delete, keep=keep, must_exist=True
    )
    return str(local_model)


async def pull_model_record(
    model_name: str,
    project: str,
    s3_bucket: str | None = None,
    prefix: str | None = None,
    art_path: str | os.PathLike[str] | None = None,
) -> bool:
    """Download the model's `model.json` (its registration: base model, LoRA shape) from
    S3, atomically; False where the bucket holds none for it."""
    uri = build_s3_path(model_name=model_name, project=project, s3_bucket=s3_bucket, prefix=prefix)
    bucket, key = split_uri(uri)
    target = model_dir(project, model_name, art_path) / "model.json"
    s3 = client()

    def pull() -> bool:
        require_bucket(s3, bucket)
        objects = {k: v for k, v in list_s3(s3, bucket, key).items() if k == "model.json"}
        if objects:
            download(s3, bucket, key, objects, target.parent, False, False, lambda _: True)
        return bool(objects)

    return await asyncio.to_thread(pull)


async def push_model_to_s3(
    model_name: str,
    project: str,
    s3_bucket: str | None = None,
    prefix: str | None = None,
    verbose: bool = False,
    delete: bool = False,
    art_path: str | None = None,
) -> None:
    """Upload a model's local directory to S3, creating the bucket if it is missing.

    Hidden files (the writer lock, a checkpoint still being written) stay behind.

    Args:
        model_name: the model's name.
        project: the model's project.
        s3_bucket: the bucket (None: `BACKUP_BUCKET`).
        prefix: a key prefix to push under.
        verbose: print each upload.
        delete: also delete what the bucket holds for the model and the local
            directory does not.
        art_path: the backend's path (None: `LocalBackend()`'s, `./.art`).
    """
    local = model_dir(project, model_name, art_path)
    if not local.is_dir():
        raise FileNotFoundError(f"Local model directory {local} does not exist.")
    uri = build_s3_path(model_name=model_name, project=project, s3_bucket=s3_bucket, prefix=prefix)
    s3 = client()

    def push() -> None:
        bucket, key = split_uri(uri)
        ensure_bucket(s3, bucket)
        push_published(
            s3,
            local,
            bucket,
            key,
            verbose=verbose,
            delete=delete,
            keep=keep_filter([], skip_hidden=True),
        )

    await asyncio.to_thread(push)


async def archive_and_presign_step_url(
    model_name: str,
    project: str,
    step: int,
    s3_bucket: str | None = None,
    prefix: str | None = None,
    verbose: bool = False,
    delete: bool = False,
    art_path: str | None = None,
    checkpoint_path: str | None = None,
) -> str:
    """Zip checkpoint `step`, upload it to `.../zipped-steps/{step:04d}.zip` and return a
    URL that downloads it without credentials for an hour.

    Args:
        checkpoint_path: the checkpoint directory to zip (default: the model's checkpoint
            `step` under `art_path`).
        delete: refused: one file is uploaded, so there is nothing to delete (ART's
            `aws s3 cp --delete` fails too).
    """
    if delete:
        raise ConfigError(
            "delete",
            "applies to directory syncs, and a zipped step is one file",
            "Leave delete=False",
        )
    directory = (
        Path(checkpoint_path)
        if checkpoint_path is not None
        else model_dir(project, model_name, art_path) / "checkpoints" / f"{step:04d}"
    )
    if not directory.is_dir():
        raise ValueError(f"Local step directory does not exist: {directory}")
    bucket, key = split_uri(
        build_s3_zipped_step_path(
            model_name=model_name, project=project, step=step, s3_bucket=s3_bucket, prefix=prefix
        )
    )
    s3 = client()

    def archive_and_presign() -> str:
        with tempfile.TemporaryDirectory() as tmp:
            archive = Path(tmp, "model.zip")
            with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
                for path in sorted(directory.rglob("*")):
                    if path.is_file():
                        zipped.write(path, path.relative_to(directory).as_posix())
            ensure_bucket(s3, bucket)
            upload(s3, archive, bucket, key, verbose)
        try:
            url: str = s3.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=_PRESIGN_SECONDS
            )
        except boto_errors() as error:
            raise s3_error(error, bucket=bucket, key=key, doing="presigning") from error
        return url

    url = await asyncio.to_thread(archive_and_presign)
    if verbose:
        print("presigned_url", url)
    return url


async def get_latest_checkpoint_step_from_s3(
    model_name: str,
    project: str,
    s3_bucket: str | None = None,
    prefix: str | None = None,
) -> int | None:
    """The highest checkpoint step stored for the model, read from the listing alone;
    None when it has none (a missing bucket or refused credentials raise `S3SyncError`)."""
    steps = await _stored_steps(model_name, project, s3_bucket, prefix)
    return steps[-1] if steps else None


async def get_checkpoint_step_not_after_from_s3(
    model_name: str,
    project: str,
    not_after_step: int,
    s3_bucket: str | None = None,
    prefix: str | None = None,
) -> int | None:
    """The highest stored checkpoint step at or before `not_after_step`; None if none."""
    steps = await _stored_steps(model_name, project, s3_bucket, prefix)
    eligible = [step for step in steps if step <= not_after_step]
    return eligible[-1] if eligible else None


async def fork_step_from_s3(
    model_name: str,
    project: str,
    s3_bucket: str,
    prefix: str | None,
    not_after_step: int | None,
    verbose: bool,
) -> int:
    """The published step a fork from S3 starts from: the latest, or the highest at or
    before `not_after_step`; an error naming what is missing when there is none."""
    where = build_s3_path(
        model_name=model_name, project=project, s3_bucket=s3_bucket, prefix=prefix
    )
    if not_after_step is None:
        step = await get_latest_checkpoint_step_from_s3(model_name, project, s3_bucket, prefix)
        if step is None:
            raise FileNotFoundError(f"{where}/checkpoints/ holds no checkpoints to fork from")
    else:
        step = await get_checkpoint_step_not_after_from_s3(
            model_name, project, not_after_step, s3_bucket, prefix
        )
        if step is None:
            raise ConfigError(
                "not_after_step",
                f"{where} has no checkpoint at or before step {not_after_step}",
                "Pick a later step, or check from_model, from_project and prefix",
            )
    if verbose:
        print(f"pulling checkpoint {step} of {project}/{model_name} from {where}")
    return step


async def _stored_steps(
    model_name: str, project: str, s3_bucket: str | None, prefix: str | None
) -> list[int]:
    uri = build_s3_path(model_name=model_name, project=project, s3_bucket=s3_bucket, prefix=prefix)
    bucket, key = split_uri(uri)
    s3 = client()

    def steps() -> tuple[list[int], list[int]]:
        require_bucket(s3, bucket)
        return split_published(
            s3, bucket, key, list_step_prefixes(s3, bucket, f"{key}/checkpoints")
        )

    published, unpublished = await asyncio.to_thread(steps)
    warn_unpublished(uri, unpublished, stacklevel=4)
    return published


async def migrate_s3_checkpoints_to_new_structure(
    model_name: str,
    project: str,
    s3_bucket: str | None = None,
    prefix: str | None = None,
    dry_run: bool = False,
) -> None:
    """Move checkpoints stored in ART's old layout, `<model>/NNNN/`, to
    `<model>/checkpoints/NNNN/`; one already in the new place is left alone. Prints
    what it does (with `dry_run`, only what it would do)."""
    uri = build_s3_path(model_name=model_name, project=project, s3_bucket=s3_bucket, prefix=prefix)
    bucket, key = split_uri(uri)
    s3 = client()
    print(f"Checking for checkpoints to migrate in {uri}")

    def migrate() -> None:
        require_bucket(s3, bucket)
        old = [f"{step:04d}" for step in list_step_prefixes(s3, bucket, key)]
        old = [name for name in old if len(name) == 4]
        if not old:
            print("No checkpoints found in old format to migrate")
            return
        print(f"Found {len(old)} checkpoint(s) to migrate: {', '.join(old)}")
        if dry_run:
            print("DRY RUN: Would migrate the following checkpoints:")
            for name in old:
                print(f"  {uri}/{name}/ -> {uri}/checkpoints/{name}/")
            return
        migrated = 0
        for name in old:
            source, target = f"{key}/{name}", f"{key}/checkpoints/{name}"
            if list_s3(s3, bucket, target):
                print(f"  Checkpoint {name} already exists in new location, skipping")
                continue
            objects = list_s3(s3, bucket, source)
            copy_within_s3(
                s3, bucket, source, objects, f"s3://{bucket}/{target}", False, False, lambda _: True
            )
            if set(list_s3(s3, bucket, target)) != set(objects):
                raise S3SyncError(
                    f"checkpoint {name} was not complete at s3://{bucket}/{target}/ after the "
                    f"copy; s3://{bucket}/{source}/ is left as it was",
                    bucket=bucket,
                    key=f"{target}/",
                    code=None,
                )
            mark_migrated(s3, bucket, key, int(name), objects)
            delete_keys(s3, bucket, [f"{source}/{relative}" for relative in objects], False)
            print(f"  Successfully migrated checkpoint {name}")
            migrated += 1
        print(f"\nMigration complete. Successfully migrated {migrated} checkpoint(s)")

    await asyncio.to_thread(migrate)


__all__ = [
    "ExcludableOption",
    "ForbiddenBucketCreationError",
    "S3Error",
    "S3SyncError",
    "archive_and_presign_step_url",
    "build_s3_path",
    "build_s3_zipped_step_path",
    "client",
    "ensure_bucket_exists",
    "fork_step_from_s3",
    "get_checkpoint_step_not_after_from_s3",
    "get_latest_checkpoint_step_from_s3",
    "list_step_prefixes",
    "migrate_s3_checkpoints_to_new_structure",
    "model_dir",
    "pull_model_from_s3",
    "pull_model_record",
    "push_model_to_s3",
    "resolve_bucket",
    "s3_sync",
]
