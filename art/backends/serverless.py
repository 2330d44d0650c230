"""`ServerlessBackend`: the HTTP client of an `art serve` server or the managed service."""

from ..core.not_built import not_built_class

ServerlessBackend = not_built_class(
    "ServerlessBackend",
    "the HTTP client for `art serve` and the managed training service is not built yet; "
    "use `art.local.LocalBackend` meanwhile",
)

__all__ = ["ServerlessBackend"]
