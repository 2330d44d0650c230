"""The S3 client, its errors, bucket checks and ART's key layout (`art.core.store.s3`'s base).

ART runs the `aws` CLI; this talks to S3 through boto3 (the `s3` extra), which reads the
same settings the CLI does: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, `AWS_PROFILE`,
`AWS_DEFAULT_REGION`, and `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`) for an
S3-compatible server.

The key layout is ART's: a model lives under
`s3://<bucket>/<prefix>/<project>/models/<name>/`, holding the local directory's files
under the same relative paths, so a checkpoint is `.../checkpoints/{step:04d}/` and a
zipped one `.../zipped-steps/{step:04d}.zip`. `s3_bucket=None` means the `BACKUP_BUCKET`
environment variable, as in ART.

    S3Error (BackendError)                    an S3 request failed; `bucket`, `key`, `code`
    ├── S3SyncError (also a RuntimeError)     a transfer or listing failed (ART's name)
    └── ForbiddenBucketCreationError          a missing bucket that could not be created
"""

from __future__ import annotations

import asyncio
import functools
import os
from pathlib import Path
from typing import Any

from ..data.errors import BackendError, ConfigError

S3Client = Any  # boto3's S3 client (its classes are generated at run time, untyped)


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


def split_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/key` as ("bucket", "some/key")."""
    rest = uri.removeprefix("s3://")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ConfigError("s3 path", f"{uri!r} names no bucket", "Write it as s3://bucket/key")
    return bucket, key


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


def s3_error(error: Exception, *, bucket: str, key: str | None, doing: str) -> S3SyncError:
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


def boto_errors() -> tuple[type[Exception], ...]:
    import boto3.exceptions
    import botocore.exceptions

    return (
        botocore.exceptions.BotoCoreError,
        botocore.exceptions.ClientError,
        boto3.exceptions.Boto3Error,
    )


async def ensure_bucket_exists(s3_bucket: str | None = None, profile: str | None = None) -> None:
    """Create the bucket if it does not exist (as ART does before every push).

    Raises:
        ForbiddenBucketCreationError: it does not exist and could not be created.
        S3SyncError: the credentials were refused, or the server could not be reached.
    """
    await asyncio.to_thread(ensure_bucket, client(profile), resolve_bucket(s3_bucket))


def ensure_bucket(s3: S3Client, bucket: str) -> None:
    import botocore.exceptions

    if bucket_exists(s3, bucket):
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


def bucket_exists(s3: S3Client, bucket: str) -> bool:
    import botocore.exceptions

    try:
        s3.head_bucket(Bucket=bucket)
    except botocore.exceptions.ClientError as error:
        code = str(error.response.get("Error", {}).get("Code"))
        if code in ("404", "NoSuchBucket", "NotFound"):
            return False
        raise s3_error(error, bucket=bucket, key=None, doing="checking") from error
    except boto_errors() as error:
        raise s3_error(error, bucket=bucket, key=None, doing="checking") from error
    return True


def require_bucket(s3: S3Client, bucket: str) -> None:
    """A pull reads from an existing bucket (ART would create an empty one)."""
    if not bucket_exists(s3, bucket):
        raise S3SyncError(
            f"bucket {bucket!r} does not exist: nothing to pull. Pass the bucket the model "
            "was pushed to (s3_bucket, or BACKUP_BUCKET)",
            bucket=bucket,
            key=None,
            code="NoSuchBucket",
        )


__all__ = [
    "ForbiddenBucketCreationError",
    "S3Client",
    "S3Error",
    "S3SyncError",
    "boto_errors",
    "bucket_exists",
    "build_s3_path",
    "build_s3_zipped_step_path",
    "client",
    "ensure_bucket",
    "ensure_bucket_exists",
    "model_dir",
    "require_bucket",
    "resolve_bucket",
    "s3_error",
    "split_uri",
]
