"""How `art serve` refuses a request: a 4xx whose `param` is the offending field's JSON
path (`a.b[0].c`, a query parameter, a header), and one warning line in its log."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..core.data.errors import ArtValueError
from ..core.data.sft_data import SHOWN_PROBLEMS, SFTDataError
from ..runtime.endpoint.server import ApiError
from .access import log_rejected


def add_error_handlers(app: FastAPI) -> None:
    """Every refusal: a 4xx naming the field by JSON path, and one warning line."""

    async def api_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, ApiError)
        log_rejected(request.method, request.url.path, error)
        return error.response()

    async def art_value_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, ArtValueError)
        log_rejected(request.method, request.url.path, ApiError(400, str(error)))
        body: dict[str, Any] = {
            "message": str(error),
            "type": "invalid_request_error",
            "param": error.field,
            "code": type(error).__name__,
            "problem": error.problem,
            "fix": error.fix,
        }
        if isinstance(error, SFTDataError):  # the first bad examples, for the client to list
            body["problems"] = error.problems[:SHOWN_PROBLEMS]
            body["problems_total"] = error.total
        return JSONResponse({"error": body}, status_code=400)

    async def invalid(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        return await api_error(request, validation_error(error.errors()))

    async def http_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)
        param = {404: "path", 405: "method"}.get(error.status_code, "body")
        message = f"{param}: {request.method} {request.url.path}: {error.detail}"
        return await api_error(request, ApiError(error.status_code, message, param=param))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(ArtValueError, art_value_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)


def validation_error(errors: Any) -> ApiError:
    """pydantic's first error as a 400 whose `param` is the JSON path (`a.b[0].c`)."""
    first = errors[0]
    location = list(first.get("loc", ()))
    where = location.pop(0) if location and location[0] in ("body", "query", "path") else ""
    if first.get("type") == "json_invalid":
        position = first.get("ctx", {}).get("error", "")
        return ApiError(400, f"body: not valid JSON ({position})", param="body")
    inner = (first.get("ctx") or {}).get("error")
    if isinstance(inner, ArtValueError):  # a nested config already named its own field
        # (A model-wide problem is named by its class, which is no part of the JSON path.)
        location.extend(part for part in inner.field.split(".") if not part[:1].isupper())
        param = json_path(location)
        return ApiError(400, f"{param}: {inner.problem}. {inner.fix}", param=param)
    param = json_path(location) or where or "body"
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        message = "unknown field; remove it (see /docs for the fields this route takes)"
    return ApiError(400, f"{param}: {message}", param=param)


def json_path(location: list[Any]) -> str:
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not str(part).startswith("function-") and "[" not in str(part):
            path += f".{part}" if path else str(part)
    return path


__all__ = ["add_error_handlers", "json_path", "validation_error"]
