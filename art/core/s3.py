"""Model directories mirrored to S3 or an S3-compatible server (ART's `art.utils.s3`).

The key layout is ART's: a model lives under
`s3://<bucket>/<prefix>/<project>/models/<name>/`, holding the local directory's files
under the same relative paths, so a checkpoint is `.../checkpoints/{step:04d}/` and a
zipped one `.../zipped-steps/{step:04d}.zip`. `s3_bucket=None` means the `BACKUP_BUCKET`
environment variable, as in ART.

ART runs the `aws` CLI; this talks to S3 through boto3 (the `s3` extra), which reads the
same settings the CLI does: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, `AWS_PROFILE`,
`AWS_DEFAULT_REGION`, and `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`) for an
S3-compatible server. `sync` follows `aws s3 sync`: a file is copied when the other side
lacks it, or has another size, or an older modification time.

A pull is atomic: every file is downloaded into a hidden staging directory first, and
only when all arrived is anything moved into place; each checkpoint directory is then
replaced in one rename, so a failed or interrupted pull never leaves a half-written
checkpoint where a backend would load it.

    S3Error (BackendError)                    an S3 request failed; `bucket`, `key`, `code`
    ├── S3SyncError (also a RuntimeError)     a transfer or listing failed (ART's name)
    └── ForbiddenBucketCreationError          a missing bucket that could not be created
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .atomic import fsync_dir, replace_dir_atomic
from .errors import BackendError, ConfigError

S3Client = Any  # boto3's S3 client (its classes are generated at run time, untyped)

ExcludableOption = Literal["checkpoints", "logs", "trajectories"]
"""A top-level folder of a model directory that a sync can leave out."""

_EXCLUDABLE: tuple[str, ...] = ("checkpoints", "logs", "trajectories")
_PRESIGN_SECONDS = 3600


class S3Error(BackendError):
    """An S3 request failed. `bucket` and `key` (None: the bucket itself) say where,
    `code` is the server's error code (None: no answer came)."""

    def __init__(self, message: str, *, bucket: str, key: str | None, code: str | None) -> None:
        self.bucket = bucket
        self.key = key
        self.code = code
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), str(self), self.bucket, self.key, self.code)


def _rebuild(
    cls: type[S3Error], message: str, bucket: str, key: str | None, code: str | None
) -> S3Error:
    return cls(message, bucket=bucket, key=key, code=code)


class S3SyncError(S3Error, RuntimeError):
    """A sync, copy or listing against S3 failed (ART raises it when `aws s3 sync` fails)."""


class ForbiddenBucketCreationError(S3Error):
    """The bucket does not exist and could not be created: it may belong to another
    account, or the credentials may not allow creating buckets."""


# --- paths ---------------------------------------------------------------------------


def resolve_bucket(s3_bucket: str | None) -> str:
    """`s3_bucket`, or else the `BACKUP_BUCKET` environment variable (ART's default)."""
    if s3_bucket is not None:
        return s3_bucket
    bucket = os.environ.get("BACKUP_BUCKET")
    if not bucket:
        raise ConfigError(
            "s3_bucket",
            "is None and the BACKUP_BUCKET environment variable is not set",
            "Pass s3_bucket='my-bucket' or set BACKUP_BUCKET",
        )
    return bucket


def build_s3_path(
    *,
    model_name: str,
    project: str,
    step: int | None = None,
    s3_bucket: str | None = None,
    prefix: str | None = None,
) -> str:
    """The `s3://` URI of a model's directory, or of its checkpoint `step`."""
    bucket = resolve_bucket(s3_bucket)
    prefix_part = f"{prefix.strip('/')}/" if prefix else ""
    path = f"s3://{bucket}/{prefix_part}{project}/models/{model_name}"
    if step is not None:
        path += f"/checkpoints/{step:04d}"
    return path


def build_s3_zipped_step_path(
    *,
    model_name: str,
    project: str,
    step: int,
    s3_bucket: str | None = None,
    prefix: str | None = None,
) -> str:
    """The `s3://` URI of checkpoint `step` zipped (`archive_and_presign_step_url`)."""
    base = build_s3_path(model_name=model_name, project=project, s3_bucket=s3_bucket, prefix=prefix)
    return f"{base}/zipped-steps/{step:04d}.zip"


def model_dir(project: str, name: str, art_path: str | os.PathLike[str] | None) -> Path:
    """A model's local directory under `art_path` (None: `LocalBackend()`'s default path,
    `./.art`, as `art.utils.output_dirs` names it)."""
    from .run_paths import get_output_dir_from_model_properties

    path = None if art_path is None else os.fspath(art_path)
    return Path(get_output_dir_from_model_properties(project, name, path))


def _split_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/key` as ("bucket", "some/key")."""
    rest = uri.removeprefix("s3://")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ConfigError("s3 path", f"{uri!r} names no bucket", "Write it as s3://bucket/key")
    return bucket, key


# --- the client and its errors --------------------------------------------------------


def client(profile: str | None = None) -> S3Client:
    """A boto3 S3 client from the environment's settings (and `profile`, if given); one
    per profile and set of `AWS_*` variables, as making one costs a tenth of a second."""
    settings = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    return _client(profile, settings)


@functools.lru_cache(maxsize=8)
def _client(profile: str | None, settings: tuple[tuple[str, str], ...]) -> S3Client:
    try:
        import boto3
        import botocore.exceptions
    except ImportError as error:
        raise ConfigError(
            "s3",
            "needs boto3, which is not installed",
            "pip install 'art-grpo[s3]' (or boto3)",
        ) from error
    try:
        session = boto3.session.Session(profile_name=profile)
    except botocore.exceptions.ProfileNotFound as error:
        raise ConfigError(
            "profile", f"{profile!r} is not an AWS profile here ({error})", "Name one in ~/.aws"
        ) from error
    return session.client("s3")


def _error(error: Exception, *, bucket: str, key: str | None, doing: str) -> S3SyncError:
    """`error` from boto3 as an `S3SyncError` saying what was being done, where, and why."""
    import boto3.exceptions
    import botocore.exceptions

    where = f"s3://{bucket}/{key}" if key else f"bucket {bucket!r}"
    code: str | None = None
    if isinstance(error, botocore.exceptions.ClientError):
        details = error.response.get("Error", {})
        code = str(details.get("Code") or error.response["ResponseMetadata"]["HTTPStatusCode"])
        why = _explain(code, bucket, key, details.get("Message", ""))
    elif isinstance(error, botocore.exceptions.NoCredentialsError):
        why = (
            "no AWS credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or AWS_PROFILE)"
        )
    elif isinstance(error, botocore.exceptions.EndpointConnectionError):
        why = f"the S3 endpoint could not be reached ({error}): check AWS_ENDPOINT_URL"
    elif isinstance(error, boto3.exceptions.S3UploadFailedError):
        text = str(error)
        code = next((c for c in ("NoSuchBucket", *_CREDENTIAL_CODES) if c in text), None)
        why = _explain(code, bucket, key, text) if code else text
    else:
        why = f"{type(error).__name__}: {error}"
    return S3SyncError(f"{doing} {where} failed: {why}", bucket=bucket, key=key, code=code)


# Most specific first: an upload's error is known only by its text.
_CREDENTIAL_CODES = (
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AccessDenied",
    "Forbidden",
    "403",
)


def _explain(code: str | None, bucket: str, key: str | None, message: str) -> str:
    if code in ("NoSuchBucket",) or (code == "404" and key is None):
        return f"bucket {bucket!r} does not exist. Create it, or pass the right s3_bucket"
    if code in _CREDENTIAL_CODES:
        return (
            f"access refused ({code}: {message or 'Forbidden'}). Check the credentials "
            "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) and that they "
            f"may use bucket {bucket!r}"
        )
    if code in ("NoSuchKey", "404"):
        return "no such key"
    return f"{code}: {message}"


def _boto_errors() -> tuple[type[Exception], ...]:
    import boto3.exceptions
    import botocore.exceptions

    return (
        botocore.exceptions.BotoCoreError,
        botocore.exceptions.ClientError,
        boto3.exceptions.Boto3Error,
    )


# --- listing ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    size: int
    mtime: float  # seconds since the epoch


def _list_s3(s3: S3Client, bucket: str, prefix: str) -> dict[str, _Entry]:
    """Objects under `prefix/` by their path relative to it."""
    root = f"{prefix.rstrip('/')}/" if prefix else ""
    found: dict[str, _Entry] = {}
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root):
            for item in page.get("Contents", []):
                relative = item["Key"][len(root) :]
                if relative and not relative.endswith("/"):
                    found[relative] = _Entry(item["Size"], item["LastModified"].timestamp())
    except _boto_errors() as error:
        raise _error(error, bucket=bucket, key=root or None, doing="listing") from error
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
    except _boto_errors() as error:
        raise _error(error, bucket=bucket, key=root, doing="listing") from error
    return sorted(steps)


def _list_local(root: Path) -> dict[str, _Entry]:
    if root.is_file():
        stat = root.stat()
        return {root.name: _Entry(stat.st_size, stat.st_mtime)}
    found: dict[str, _Entry] = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = Path(directory, name)
            stat = path.stat()
            found[path.relative_to(root).as_posix()] = _Entry(stat.st_size, stat.st_mtime)
    return found


def _keep(exclude: Iterable[str], skip_hidden: bool) -> Callable[[str], bool]:
    """The filter of relative paths a sync looks at (`aws s3 sync --exclude` patterns)."""
    patterns = list(exclude)

    def keep(relative: str) -> bool:
        if skip_hidden and any(part.startswith(".") for part in relative.split("/")):
            return False
        return not any(fnmatch.fnmatchcase(relative, pattern) for pattern in patterns)

    return keep


def _changed(source: _Entry, destination: _Entry | None) -> bool:
    return (
        destination is None
        or source.size != destination.size
        or int(source.mtime) > int(destination.mtime)
    )


# --- sync -------------------------------------------------------------------------------


def _check_exclude(exclude: list[ExcludableOption] | None) -> list[str]:
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
    patterns = _check_exclude(exclude)
    await asyncio.to_thread(
        _sync,
        source,
        destination,
        s3=client(profile),
        verbose=verbose,
        delete=delete,
        keep=_keep(patterns, skip_hidden=False),
    )


def _sync(
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
        bucket, key = _split_uri(destination)
        if local.is_file():
            if keep(local.name):
                _upload(s3, local, bucket, key, verbose)
                return 1
            return 0
        return _upload_dir(s3, local, bucket, key, verbose=verbose, delete=delete, keep=keep)
    bucket, key = _split_uri(source)
    objects = {k: v for k, v in _list_s3(s3, bucket, key).items() if keep(k)}
    if must_exist and not objects:
        raise S3SyncError(
            f"nothing is stored under s3://{bucket}/{key}/ (check the bucket, prefix, "
            "project, model name and step)",
            bucket=bucket,
            key=f"{key}/",
            code="NoSuchKey",
        )
    if to_s3:
        return _copy_within_s3(s3, bucket, key, objects, destination, verbose, delete, keep)
    return _download(s3, bucket, key, objects, Path(destination), verbose, delete, keep)


def _upload(s3: S3Client, path: Path, bucket: str, key: str, verbose: bool) -> None:
    try:
        s3.upload_file(str(path), bucket, key)
    except _boto_errors() as error:
        raise _error(error, bucket=bucket, key=key, doing=f"uploading {path} to") from error
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
    files = {k: v for k, v in _list_local(local).items() if keep(k)}
    remote = {k: v for k, v in _list_s3(s3, bucket, key).items() if keep(k)}
    root = f"{key.rstrip('/')}/" if key else ""
    todo = [relative for relative, entry in files.items() if _changed(entry, remote.get(relative))]
    # Checkpoint files first, the model's records (model.json, history) after them.
    todo.sort(key=lambda relative: (not relative.startswith("checkpoints/"), relative))
    for relative in todo:
        _upload(s3, local / relative, bucket, root + relative, verbose)
    if delete:
        _delete_keys(s3, bucket, [root + k for k in remote if k not in files], verbose)
    return len(todo)


def _delete_keys(s3: S3Client, bucket: str, keys: list[str], verbose: bool) -> None:
    for start in range(0, len(keys), 1000):
        batch = keys[start : start + 1000]
        try:
            answer = s3.delete_objects(
                Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
        except _boto_errors() as error:
            raise _error(error, bucket=bucket, key=batch[0], doing="deleting") from error
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


def _copy_within_s3(
    s3: S3Client,
    bucket: str,
    key: str,
    objects: dict[str, _Entry],
    destination: str,
    verbose: bool,
    delete: bool,
    keep: Callable[[str], bool],
) -> int:
    to_bucket, to_key = _split_uri(destination)
    source_root = f"{key.rstrip('/')}/" if key else ""
    root = f"{to_key.rstrip('/')}/" if to_key else ""
    existing = {k: v for k, v in _list_s3(s3, to_bucket, to_key).items() if keep(k)}
    todo = [
        relative for relative, entry in objects.items() if _changed(entry, existing.get(relative))
    ]
    for relative in todo:
        try:
            s3.copy({"Bucket": bucket, "Key": source_root + relative}, to_bucket, root + relative)
        except _boto_errors() as error:
            raise _error(
                error, bucket=bucket, key=source_root + relative, doing="copying"
            ) from error
        if verbose:
            print(
                f"copy: s3://{bucket}/{source_root}{relative} to s3://{to_bucket}/{root}{relative}"
            )
    if delete:
        _delete_keys(s3, to_bucket, [root + k for k in existing if k not in objects], verbose)
    return len(todo)


def _download(
    s3: S3Client,
    bucket: str,
    key: str,
    objects: dict[str, _Entry],
    destination: Path,
    verbose: bool,
    delete: bool,
    keep: Callable[[str], bool],
) -> int:
    """Download into a hidden staging directory beside `destination`, then install."""
    root = f"{key.rstrip('/')}/" if key else ""
    local = (
        {k: v for k, v in _list_local(destination).items() if keep(k)}
        if destination.is_dir()
        else {}
    )
    todo = [relative for relative, entry in objects.items() if _changed(entry, local.get(relative))]
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
            except _boto_errors() as error:
                raise _error(
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
            {p for p in _list_local(target) if p not in gone and p not in came}
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


# --- buckets ----------------------------------------------------------------------------


async def ensure_bucket_exists(s3_bucket: str | None = None, profile: str | None = None) -> None:
    """Create the bucket if it does not exist (as ART does before every push).

    Raises:
        ForbiddenBucketCreationError: it does not exist and could not be created.
        S3SyncError: the credentials were refused, or the server could not be reached.
    """
    await asyncio.to_thread(_ensure_bucket, client(profile), resolve_bucket(s3_bucket))


def _ensure_bucket(s3: S3Client, bucket: str) -> None:
    import botocore.exceptions

    if _bucket_exists(s3, bucket):
        return
    print(f"S3 bucket {bucket} does not exist, creating it")
    region = s3.meta.region_name
    try:
        if region and region != "us-east-1":
            s3.create_bucket(
                Bucket=bucket,
                CreateBucketConfiguration={"LocationConstraint": region},
            )
        else:
            s3.create_bucket(Bucket=bucket)
    except botocore.exceptions.ClientError as error:
        code = error.response.get("Error", {}).get("Code")
        raise ForbiddenBucketCreationError(
            f"bucket {bucket!r} does not exist and could not be created ({code}: "
            f"{error.response.get('Error', {}).get('Message', '')}). It may belong to another "
            "account, or the credentials may not allow creating buckets: create it yourself "
            "or name another s3_bucket",
            bucket=bucket,
            key=None,
            code=code,
        ) from error


def _bucket_exists(s3: S3Client, bucket: str) -> bool:
    import botocore.exceptions

    try:
        s3.head_bucket(Bucket=bucket)
    except botocore.exceptions.ClientError as error:
        code = str(error.response.get("Error", {}).get("Code"))
        if code in ("404", "NoSuchBucket", "NotFound"):
            return False
        raise _error(error, bucket=bucket, key=None, doing="checking") from error
    except _boto_errors() as error:
        raise _error(error, bucket=bucket, key=None, doing="checking") from error
    return True


def _require_bucket(s3: S3Client, bucket: str) -> None:
    """A pull reads from an existing bucket (ART would create an empty one)."""
    if not _bucket_exists(s3, bucket):
        raise S3SyncError(
            f"bucket {bucket!r} does not exist: nothing to pull. Pass the bucket the model "
            "was pushed to (s3_bucket, or BACKUP_BUCKET)",
            bucket=bucket,
            key=None,
            code="NoSuchBucket",
        )


# --- models -----------------------------------------------------------------------------


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
    patterns = _check_exclude(exclude)
    uri = build_s3_path(
        model_name=model_name, project=project, step=step, s3_bucket=s3_bucket, prefix=prefix
    )
    local_model = model_dir(project, model_name, art_path)
    local = local_model / "checkpoints" / f"{step:04d}" if step is not None else local_model
    model_uri = build_s3_path(
        model_name=model_name, project=project, s3_bucket=s3_bucket, prefix=prefix
    )
    bucket, model_key = _split_uri(model_uri)
    s3 = client()

    def published_only() -> Callable[[str], bool]:
        """The filter of what to pull: unpublished checkpoints left out (and warned of)."""
        from .s3_publish import split_published, unpublished_error

        _require_bucket(s3, bucket)
        if step is not None:
            stored = _list_s3(s3, bucket, f"{model_key}/checkpoints/{step:04d}")
            if stored and not split_published(s3, bucket, model_key, [step])[0]:
                raise unpublished_error(model_uri, step, bucket, model_key)
            return _keep(patterns, skip_hidden=True)
        steps = list_step_prefixes(s3, bucket, f"{model_key}/checkpoints")
        skipped[:] = split_published(s3, bucket, model_key, steps)[1]
        left_out = [f"checkpoints/{s:04d}/*" for s in skipped]
        return _keep([*patterns, *left_out], skip_hidden=True)

    skipped: list[int] = []
    keep = await asyncio.to_thread(published_only)
    if skipped:
        from .s3_publish import warn_unpublished

        warn_unpublished(model_uri, skipped)
    await asyncio.to_thread(
        _sync, uri, str(local), s3=s3, verbose=verbose, delete=delete, keep=keep, must_exist=True
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
    bucket, key = _split_uri(uri)
    target = model_dir(project, model_name, art_path) / "model.json"
    s3 = client()

    def pull() -> bool:
        _require_bucket(s3, bucket)
        objects = {k: v for k, v in _list_s3(s3, bucket, key).items() if k == "model.json"}
        if objects:
            _download(s3, bucket, key, objects, target.parent, False, False, lambda _: True)
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
        from .s3_publish import push_published

        bucket, key = _split_uri(uri)
        _ensure_bucket(s3, bucket)
        push_published(
            s3, local, bucket, key, verbose=verbose, delete=delete, keep=_keep([], skip_hidden=True)
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
    bucket, key = _split_uri(
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
            _ensure_bucket(s3, bucket)
            _upload(s3, archive, bucket, key, verbose)
        try:
            url: str = s3.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=_PRESIGN_SECONDS
            )
        except _boto_errors() as error:
            raise _error(error, bucket=bucket, key=key, doing="presigning") from error
        return url

    url = await asyncio.to_thread(archive_and_presign)
    if verbose:
        print("presigned_url", url)
    return url


# --- checkpoint steps -------------------------------------------------------------------


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
    bucket, key = _split_uri(uri)
    s3 = client()

    def steps() -> tuple[list[int], list[int]]:
        from .s3_publish import split_published

        _require_bucket(s3, bucket)
        return split_published(
            s3, bucket, key, list_step_prefixes(s3, bucket, f"{key}/checkpoints")
        )

    published, unpublished = await asyncio.to_thread(steps)
    from .s3_publish import warn_unpublished

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
    bucket, key = _split_uri(uri)
    s3 = client()
    print(f"Checking for checkpoints to migrate in {uri}")

    def migrate() -> None:
        from .s3_publish import mark_migrated

        _require_bucket(s3, bucket)
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
            if _list_s3(s3, bucket, target):
                print(f"  Checkpoint {name} already exists in new location, skipping")
                continue
            objects = _list_s3(s3, bucket, source)
            _copy_within_s3(
                s3, bucket, source, objects, f"s3://{bucket}/{target}", False, False, lambda _: True
            )
            if set(_list_s3(s3, bucket, target)) != set(objects):
                raise S3SyncError(
                    f"checkpoint {name} was not complete at s3://{bucket}/{target}/ after the "
                    f"copy; s3://{bucket}/{source}/ is left as it was",
                    bucket=bucket,
                    key=f"{target}/",
                    code=None,
                )
            mark_migrated(s3, bucket, key, int(name), objects)
            _delete_keys(s3, bucket, [f"{source}/{relative}" for relative in objects], False)
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
