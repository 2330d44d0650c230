"""`aws s3 sync` over boto3: listing both sides, copying what changed, and pulls that
install atomically.

A file is copied when the other side lacks it, or has another size, or an older
modification time (`aws s3 sync`'s rule). A pull is atomic: every file is downloaded into
a hidden staging directory first, and only when all arrived is anything moved into place;
each checkpoint directory is then replaced in one rename, so a failed or interrupted pull
never leaves a half-written checkpoint where a backend would load it.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..data.errors import ConfigError
from .atomic import fsync_dir, replace_dir_atomic
from .s3_client import S3Client, S3SyncError, boto_errors, client, s3_error, split_uri

ExcludableOption = Literal["checkpoints", "logs", "trajectories"]
"""A top-level folder of a model directory that a sync can leave out."""

_EXCLUDABLE: tuple[str, ...] = ("checkpoints", "logs", "trajectories")


@dataclass(frozen=True)
class Entry:
    size: int
    mtime: float  # seconds since the epoch


def list_s3(s3: S3Client, bucket: str, prefix: str) -> dict[str, Entry]:
    """Objects under `prefix/` by their path relative to it."""
    root = f"{prefix.rstrip('/')}/" if prefix else ""
    found: dict[str, Entry] = {}
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root):
            for item in page.get("Contents", []):
                relative = item["Key"][len(root) :]
                if relative and not relative.endswith("/"):
                    found[relative] = Entry(item["Size"], item["LastModified"].timestamp())
    except boto_errors() as error:
        raise s3_error(error, bucket=bucket, key=root or None, doing="listing") from error
    return found


def list_step_prefixes(s3: S3Client, bucket: str, prefix: str) -> list[int]:
    """The steps of the `NNNN/` folders directly under `prefix/`, ascending."""
    root = f"{prefix.rstrip('/')}/"
    steps: list[int] = []
    try:
        pages = s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=root, Delimiter="/"
        )
        for page in pages:
            for common in page.get("CommonPrefixes", []):
                name = common["Prefix"][len(root) :].rstrip("/")
                if name.isdigit():
                    steps.append(int(name))
    except boto_errors() as error:
        raise s3_error(error, bucket=bucket, key=root, doing="listing") from error
    return sorted(steps)


def list_local(root: Path) -> dict[str, Entry]:
    if root.is_file():
        stat = root.stat()
        return {root.name: Entry(stat.st_size, stat.st_mtime)}
    found: dict[str, Entry] = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = Path(directory, name)
            stat = path.stat()
            found[path.relative_to(root).as_posix()] = Entry(stat.st_size, stat.st_mtime)
    return found


def keep_filter(exclude: Iterable[str], skip_hidden: bool) -> Callable[[str], bool]:
    """The filter of relative paths a sync looks at (`aws s3 sync --exclude` patterns)."""
    patterns = list(exclude)

    def keep(relative: str) -> bool:
        if skip_hidden and any(part.startswith(".") for part in relative.split("/")):
            return False
        return not any(fnmatch.fnmatchcase(relative, pattern) for pattern in patterns)

    return keep


def changed(source: Entry, destination: Entry | None) -> bool:
    return (
        destination is None
        or source.size != destination.size
        or int(source.mtime) > int(destination.mtime)
    )


def check_exclude(exclude: list[ExcludableOption] | None) -> list[str]:
    for option in exclude or []:
        if option not in _EXCLUDABLE:
            raise ConfigError(
                "exclude", f"{option!r} is not a folder a sync can leave out", f"Use {_EXCLUDABLE}"
            )
    return [f"{option}/*" for option in exclude or []]


async def s3_sync(
    source: str,
    destination: str,
    *,
    profile: str | None = None,
    verbose: bool = False,
    delete: bool = False,
    exclude: list[ExcludableOption] | None = None,
) -> None:
    """Make `destination` hold what `source` holds, like `aws s3 sync` (`aws s3 cp` for a
    single file). Either side, or both, may be an `s3://` URI.

    Args:
        source: a local file or directory, or an `s3://` URI.
        destination: a local directory (a file's path, for a file), or an `s3://` URI.
        profile: the AWS profile whose credentials to use (default: the environment's).
        verbose: print each copy and deletion.
        delete: also delete what `destination` holds and `source` does not (not for a
            single file).
        exclude: top-level folders to leave out, on both sides.

    Raises:
        S3SyncError: a request failed; the message names the bucket and key.
    """
    patterns = check_exclude(exclude)
    await asyncio.to_thread(
        sync,
        source,
        destination,
        s3=client(profile),
        verbose=verbose,
        delete=delete,
        keep=keep_filter(patterns, skip_hidden=False),
    )


def sync(
    source: str,
    destination: str,
    *,
    s3: S3Client,
    verbose: bool,
    delete: bool,
    keep: Callable[[str], bool],
    must_exist: bool = False,
) -> int:
    """`s3_sync`'s work; returns the number of files copied. With `must_exist`, an S3
    source holding nothing is an error naming it."""
    from_s3, to_s3 = source.startswith("s3://"), destination.startswith("s3://")
    if not from_s3 and not to_s3:
        raise ConfigError(
            "source", "and destination are both local paths", "Make one of them an s3:// URI"
        )
    if not from_s3:
        local = Path(source)
        if not local.exists():
            raise FileNotFoundError(f"{local} does not exist: nothing to upload")
        if local.is_file() and delete:
            raise ConfigError(
                "delete", f"applies to directories, and {local} is a file", "Leave delete=False"
            )
        bucket, key = split_uri(destination)
        if local.is_file():
            if keep(local.name):
                upload(s3, local, bucket, key, verbose)
                return 1
            return 0
        return _upload_dir(s3, local, bucket, key, verbose=verbose, delete=delete, keep=keep)
    bucket, key = split_uri(source)
    objects = {k: v for k, v in list_s3(s3, bucket, key).items() if keep(k)}
    if must_exist and not objects:
        raise S3SyncError(
            f"nothing is stored under s3://{bucket}/{key}/ (check the bucket, prefix, "
            "project, model name and step)",
            bucket=bucket,
            key=f"{key}/",
            code="NoSuchKey",
        )
    if to_s3:
        return copy_within_s3(s3, bucket, key, objects, destination, verbose, delete, keep)
    return download(s3, bucket, key, objects, Path(destination), verbose, delete, keep)


def upload(s3: S3Client, path: Path, bucket: str, key: str, verbose: bool) -> None:
    try:
        s3.upload_file(str(path), bucket, key)
    except boto_errors() as error:
        raise s3_error(error, bucket=bucket, key=key, doing=f"uploading {path} to") from error
    if verbose:
        print(f"upload: {path} to s3://{bucket}/{key}")


def _upload_dir(
    s3: S3Client,
    local: Path,
    bucket: str,
    key: str,
    *,
    verbose: bool,
    delete: bool,
    keep: Callable[[str], bool],
) -> int:
    files = {k: v for k, v in list_local(local).items() if keep(k)}
    remote = {k: v for k, v in list_s3(s3, bucket, key).items() if keep(k)}
    root = f"{key.rstrip('/')}/" if key else ""
    todo = [relative for relative, entry in files.items() if changed(entry, remote.get(relative))]
    # Checkpoint files first, the model's records (model.json, history) after them.
    todo.sort(key=lambda relative: (not relative.startswith("checkpoints/"), relative))
    for relative in todo:
        upload(s3, local / relative, bucket, root + relative, verbose)
    if delete:
        delete_keys(s3, bucket, [root + k for k in remote if k not in files], verbose)
    return len(todo)


def delete_keys(s3: S3Client, bucket: str, keys: list[str], verbose: bool) -> None:
    for start in range(0, len(keys), 1000):
        batch = keys[start : start + 1000]
        try:
            answer = s3.delete_objects(
                Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
        except boto_errors() as error:
            raise s3_error(error, bucket=bucket, key=batch[0], doing="deleting") from error
        for failure in answer.get("Errors", []):
            raise S3SyncError(
                f"deleting s3://{bucket}/{failure.get('Key')} failed: "
                f"{failure.get('Code')}: {failure.get('Message')}",
                bucket=bucket,
                key=failure.get("Key"),
                code=failure.get("Code"),
            )
        if verbose:
            for k in batch:
                print(f"delete: s3://{bucket}/{k}")


def copy_within_s3(
    s3: S3Client,
    bucket: str,
    key: str,
    objects: dict[str, Entry],
    destination: str,
    verbose: bool,
    delete: bool,
    keep: Callable[[str], bool],
) -> int:
    to_bucket, to_key = split_uri(destination)
    source_root = f"{key.rstrip('/')}/" if key else ""
    root = f"{to_key.rstrip('/')}/" if to_key else ""
    existing = {k: v for k, v in list_s3(s3, to_bucket, to_key).items() if keep(k)}
    todo = [
        relative for relative, entry in objects.items() if changed(entry, existing.get(relative))
    ]
    for relative in todo:
        try:
            s3.copy({"Bucket": bucket, "Key": source_root + relative}, to_bucket, root + relative)
        except boto_errors() as error:
            raise s3_error(
                error, bucket=bucket, key=source_root + relative, doing="copying"
            ) from error
        if verbose:
            print(
                f"copy: s3://{bucket}/{source_root}{relative} to s3://{to_bucket}/{root}{relative}"
            )
    if delete:
        delete_keys(s3, to_bucket, [root + k for k in existing if k not in objects], verbose)
    return len(todo)


def download(
    s3: S3Client,
    bucket: str,
    key: str,
    objects: dict[str, Entry],
    destination: Path,
    verbose: bool,
    delete: bool,
    keep: Callable[[str], bool],
) -> int:
    """Download into a hidden staging directory beside `destination`, then install."""
    root = f"{key.rstrip('/')}/" if key else ""
    local = (
        {k: v for k, v in list_local(destination).items() if keep(k)}
        if destination.is_dir()
        else {}
    )
    todo = [relative for relative, entry in objects.items() if changed(entry, local.get(relative))]
    doomed = [relative for relative in local if relative not in objects] if delete else []
    if not todo and not doomed:
        return 0
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(
        tempfile.mkdtemp(prefix=f".{destination.name}.pull-", suffix=".tmp", dir=destination.parent)
    )
    try:
        for relative in todo:
            target = staging / relative
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(bucket, root + relative, str(target))
            except boto_errors() as error:
                raise s3_error(
                    error, bucket=bucket, key=root + relative, doing="downloading"
                ) from error
            except OSError as error:  # the local side refused it (a key that is also a folder)
                raise S3SyncError(
                    f"downloading s3://{bucket}/{root}{relative} failed: cannot write it at "
                    f"{destination / relative} ({error.strerror or error}); nothing was changed "
                    f"under {destination}",
                    bucket=bucket,
                    key=root + relative,
                    code=None,
                ) from error
            # As `aws s3 sync`: the file's time is the object's, so the next sync skips it.
            os.utime(target, (objects[relative].mtime, objects[relative].mtime))
        _install(staging, destination, todo, doomed)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if verbose:
        for relative in todo:
            print(f"download: s3://{bucket}/{root}{relative} to {destination / relative}")
        for relative in doomed:
            print(f"delete: {destination / relative}")
    return len(todo)


def _unit(destination: Path, relative: str) -> str | None:
    """The checkpoint directory (relative to `destination`, "" for itself) that
    `relative` belongs to: it is replaced whole. None for a file of no checkpoint."""
    if destination.parent.name == "checkpoints" and destination.name.isdigit():
        return ""
    parts = relative.split("/")
    if len(parts) >= 3 and parts[0] == "checkpoints" and parts[1].isdigit():
        return f"checkpoints/{parts[1]}"
    return None


def _install(staging: Path, destination: Path, arrived: list[str], doomed: list[str]) -> None:
    """Move what `staging` holds into `destination`: each checkpoint directory in one
    rename (its files kept, replaced or deleted as the sync says), other files one by one."""
    units: dict[str, list[str]] = {}
    for relative in [*arrived, *doomed]:
        unit = _unit(destination, relative)
        if unit is not None:
            units.setdefault(unit, []).append(relative)
    for unit in units:
        target = destination / unit if unit else destination
        prefix = f"{unit}/" if unit else ""
        gone = {relative[len(prefix) :] for relative in doomed if relative.startswith(prefix)}
        came = {relative[len(prefix) :] for relative in arrived if relative.startswith(prefix)}
        kept = (
            {p for p in list_local(target) if p not in gone and p not in came}
            if target.is_dir()
            else set()
        )
        if not kept and not came:
            _remove_dir(target)
            continue

        def fill(
            tmp: Path,
            target: Path = target,
            kept: set[str] = kept,
            came: set[str] = came,
            prefix: str = prefix,
        ) -> None:
            for name in kept:
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                _link_or_copy(target / name, tmp / name)
            for name in came:
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.move(staging / prefix / name, tmp / name)

        replace_dir_atomic(target, fill)
    for relative in arrived:
        if _unit(destination, relative) is None:
            target = destination / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / relative, target)
            fsync_dir(target.parent)
    for relative in doomed:
        if _unit(destination, relative) is None:
            (destination / relative).unlink(missing_ok=True)


def _link_or_copy(source: Path, target: Path) -> None:
    """A file kept in a rebuilt checkpoint: hard-linked (no bytes copied; the old
    directory's name goes away, the data stays), copied where links are refused."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _remove_dir(target: Path) -> None:
    if target.is_dir():
        doomed = target.with_name(f".{target.name}.deleting")
        shutil.rmtree(doomed, ignore_errors=True)
        os.replace(target, doomed)  # gone from view at once, even if rmtree is interrupted
        shutil.rmtree(doomed)


__all__ = [
    "Entry",
    "ExcludableOption",
    "changed",
    "check_exclude",
    "copy_within_s3",
    "delete_keys",
    "download",
    "keep_filter",
    "list_local",
    "list_s3",
    "list_step_prefixes",
    "s3_sync",
    "sync",
    "upload",
]
