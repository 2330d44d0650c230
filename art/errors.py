"""ART's `art.errors` import path: ART 0.5.23's exception names on `art`'s one error tree.

Each name is the class of ours with the same meaning (see `art.core.data.errors`), so code
that catches ART's exceptions catches ours:

- `ARTError`, the base of ART's errors, is our base `ArtError`: catching it catches every
  error `art` raises on purpose (constructed, it takes a message; ART's `status_code` is
  carried only by the deployment errors below).
- `LocalServingUnavailableError` (a RuntimeError) and `ArtVllmMetricsTimeoutError` (a
  TimeoutError) are `BackendError`s.
- `ForbiddenBucketCreationError` is the one `art.utils.s3` raises (an `S3Error`).
- `UnsupportedLoRADeploymentProviderError`, `UnsupportedBaseModelDeploymentError` and
  `LoRADeploymentTimedOutError` are `DeploymentError`s with ART's status codes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core.data.errors import (
    ArtError as ARTError,
)
from .core.data.errors import (
    ArtVllmMetricsTimeoutError,
    LocalServingUnavailableError,
    LoRADeploymentTimedOutError,
    UnsupportedBaseModelDeploymentError,
    UnsupportedLoRADeploymentProviderError,
)

if TYPE_CHECKING:
    from .core.store.s3_client import ForbiddenBucketCreationError as ForbiddenBucketCreationError


def __getattr__(name: str) -> Any:
    # art.core.store.s3_client holds the S3 errors: loaded only when its error is asked for.
    if name == "ForbiddenBucketCreationError":
        from .core.store.s3_client import ForbiddenBucketCreationError

        return ForbiddenBucketCreationError
    raise AttributeError(f"module 'art.errors' has no attribute {name!r}")


__all__ = [
    "ARTError",
    "ArtVllmMetricsTimeoutError",
    "ForbiddenBucketCreationError",
    "LoRADeploymentTimedOutError",
    "LocalServingUnavailableError",
    "UnsupportedBaseModelDeploymentError",
    "UnsupportedLoRADeploymentProviderError",
]
