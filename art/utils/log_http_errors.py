"""`log_http_errors`: an httpx status error turned into a `BackendError` that says what failed."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import httpx

from ..core.data.errors import BackendError

P = ParamSpec("P")
R = TypeVar("R")


def log_http_errors(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Re-raise `httpx.HTTPStatusError` from the decorated coroutine as a `BackendError`
    naming the status, the URL and the server's `detail` (or body)."""

    @functools.wraps(function)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await function(*args, **kwargs)
        except httpx.HTTPStatusError as error:
            try:
                body = error.response.json()
                detail = body.get("detail", body) if isinstance(body, dict) else body
            except ValueError:  # not JSON: the text is the detail
                detail = error.response.text
            raise BackendError(
                f"[HTTP {error.response.status_code}] {error.request.url} {detail}"
            ) from error

    return wrapper


__all__ = ["log_http_errors"]
