"""What a chat completion request may hold, and how a bad one is answered.

A request is read with a size limit, then parsed and validated off the event loop
(`parse_chat_request` is synchronous: call it in a thread), so a huge or hostile body
never stalls the other requests or `/health`. Every refusal is an `ApiError`: a 4xx in
OpenAI's error shape whose `param` is the JSON path of the bad value (`messages[0].role`),
logged as one line, without a traceback.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from fastapi.responses import JSONResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from starlette.requests import Request

from ...core.data.errors import ArtValueError
from ...core.data.history import check_message_or_choice, check_tool

logger = logging.getLogger("art.endpoint")

# torch seeds a generator with an unsigned 64-bit integer and row i of a request uses
# seed + i (n <= 64), so seeds stop where that sum still fits.
MAX_SEED = 2**63 - 1
# Bytes of request body a token of prompt may take: JSON escapes (`\u00e9` is six bytes)
# and long tokens leave a prompt that fills the context well under this.
BODY_BYTES_PER_TOKEN = 64
MIN_BODY_BYTES = 1024 * 1024

Body = TypeVar("Body", bound=BaseModel)  # a request schema


class ApiError(Exception):
    """An error answered as OpenAI does: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self, protocol: Literal["openai", "anthropic"] = "openai") -> JSONResponse:
        """The error in `protocol`'s shape: OpenAI's, or Anthropic's for `/v1/messages`."""
        if protocol == "anthropic":
            return JSONResponse(
                {
                    "type": "error",
                    "error": {
                        "type": _ANTHROPIC_TYPES.get(self.status, "api_error"),
                        "message": self.message,
                    },
                },
                status_code=self.status,
            )
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        body = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, status_code=self.status)


# Anthropic's error types by status (docs.anthropic.com, "Errors").
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
}


def error_protocol(request: Request) -> Literal["openai", "anthropic"]:
    """Whose error shape a request is answered in: Anthropic's on its Messages route."""
    return "anthropic" if request.url.path.startswith("/v1/messages") else "openai"


def log_rejected(request: Request, status: int, message: str) -> None:
    """One line per refused request: what was asked and why it was refused."""
    logger.info("refused %s %s: %d %s", request.method, request.url.path, status, message[:300])


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    n: int = Field(default=1, ge=1, le=64)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    frequency_penalty: float = Field(default=0.0, ge=0, le=0)
    presence_penalty: float = Field(default=0.0, ge=0, le=0)
    response_format: dict[str, Any] | None = None
    user: str | None = None  # an end-user id for the caller's own bookkeeping
    # vLLM's extension: variables for the chat template, over the model's own
    # (`InternalModelConfig.chat_template_kwargs`), for this request only.
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's extension: logprob tokens written `token_id:N`, so the sampled ids survive a
    # client that rebuilds each Choice (None: the server's default; `art run` writes them).
    return_tokens_as_token_ids: bool | None = None
    # vLLM's extensions: the prompt ends with a new assistant turn opened (the default), or
    # with the last message, an assistant's, left open for the model to continue (prefill).
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @model_validator(mode="after")
    def _check_continuation(self) -> ChatCompletionRequest:
        if not self.continue_final_message:
            return self
        if self.add_generation_prompt:
            raise ArtValueError(
                "continue_final_message",
                "is true with add_generation_prompt, which would open a new turn",
                "Set add_generation_prompt to false",
            )
        if self.messages[-1].get("role") != "assistant":
            raise ArtValueError(
                "continue_final_message",
                f"is true but the last message is the {self.messages[-1].get('role')}'s",
                "End messages with the assistant message to continue",
            )
        return self

    @field_validator("messages")
    @classmethod
    def _check_messages(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for index, message in enumerate(messages):
            checked = check_message_or_choice(message, f"messages[{index}]")
            if not isinstance(checked, dict):
                raise ValueError(f"messages[{index}] must be a message object")
        return messages

    @field_validator("tools")
    @classmethod
    def _check_tools(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for index, tool in enumerate(tools or []):
            check_tool(tool, f"tools[{index}]")
        return tools

    @field_validator("tool_choice")
    @classmethod
    def _check_tool_choice(cls, value: Any) -> Any:
        if isinstance(value, dict):
            function = value.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError(
                    'an object tool_choice is {"type": "function", "function": {"name": ...}}'
                )
        return value

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        return check_stop(stop)

    @field_validator("response_format")
    @classmethod
    def _check_response_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        kind = (value or {}).get("type")
        if value is None or kind in ("text", "json_object"):
            return value
        if kind != "json_schema":
            raise ValueError(f"type {kind!r} is not one of 'text', 'json_object', 'json_schema'")
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ValueError(
                'json_schema needs {"name": ..., "schema": {a JSON schema object}, "strict": true}'
            )
        return value


def check_stop(stop: str | list[str] | None) -> str | list[str] | None:
    """`stop` if OpenAI takes it: a non-empty string, or at most 4 of them."""
    if isinstance(stop, list) and (len(stop) > 4 or not all(stop)):
        raise ValueError("stop takes at most 4 non-empty strings")
    if stop == "":
        raise ValueError("stop must not be empty")
    return stop


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, or a 413 as soon as it is known to exceed `max_bytes`.

    A declared Content-Length is checked before anything is read; a streamed body is
    counted as it arrives, so an oversized one is never held whole.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(int(declared), max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(size, max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, max_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"body: the request body has {'at least ' if size else ''}{size} bytes; this endpoint "
        f"takes at most {max_bytes}, which already holds more text than the model's context. "
        "Send a shorter conversation",
        param="body",
        code="request_too_large",
    )


def parse_chat_request(raw: bytes) -> ChatCompletionRequest:
    """The validated request in `raw` (a JSON body), or a 400 naming the bad value."""
    return parse_body(raw, ChatCompletionRequest)


# Deeper than any request of the four protocols nests (a tool's JSON schema included);
# Python's JSON reader and pydantic recurse, so a hostile body must be stopped here.
MAX_JSON_DEPTH = 64
_SURROGATE = re.compile("[\ud800-\udfff]")


def parse_body(raw: bytes, schema: type[Body]) -> Body:
    """`raw`, a JSON object, validated as `schema`; or a 400 naming the bad value (not
    JSON, nested deeper than `MAX_JSON_DEPTH`, text holding a lone UTF-16 surrogate,
    a field of the wrong type or range)."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(
            400, f"body: the request body is not valid JSON ({error})", param="body"
        ) from error
    except RecursionError as error:  # nested past the JSON reader's recursion limit
        raise _too_deep() from error
    if not isinstance(data, dict):
        raise ApiError(400, "body: the request body must be a JSON object", param="body")
    check_plain_json(data)
    try:
        return schema.model_validate(data)
    except ValidationError as error:
        raise validation_error(error.errors()) from error


def check_plain_json(data: dict[str, Any]) -> None:
    """A 400 for a body nested deeper than `MAX_JSON_DEPTH`, or holding a string (value or
    key) with a lone UTF-16 surrogate, which JSON can escape but is not text: no
    tokenizer or encoder takes it. Walked without recursion."""
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(data, ())]
    while stack:
        value, location = stack.pop()
        if len(location) > MAX_JSON_DEPTH:
            raise _too_deep()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                param = json_path(location) or "body"
                raise ApiError(
                    400,
                    f"{param}: the text holds a lone UTF-16 surrogate, which is not a "
                    "character. Send valid Unicode (a surrogate pair escapes one character)",
                    param=param,
                )
        elif isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE.search(key):
                    param = json_path(location) or "body"
                    raise ApiError(
                        400, f"{param}: a key holds a lone UTF-16 surrogate", param=param
                    )
                stack.append((item, (*location, key)))
        elif isinstance(value, list):
            stack.extend((item, (*location, index)) for index, item in enumerate(value))


def _too_deep() -> ApiError:
    return ApiError(
        400,
        f"body: the request body nests deeper than {MAX_JSON_DEPTH} levels, which no "
        "request of this API needs. Flatten it",
        param="body",
    )


def json_path(location: Sequence[int | str]) -> str | None:
    """`("messages", 0, "role")` as `messages[0].role`; None for the whole body."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or None


def validation_error(errors: Sequence[Any]) -> ApiError:
    """A 400 for the first of pydantic's (or FastAPI's) validation errors."""
    first = errors[0]
    kind = first.get("type")
    location = [part for part in first.get("loc", ()) if part != "body"]
    if kind == "json_invalid":  # FastAPI's location is a character offset, not a field
        detail = first.get("ctx", {}).get("error", "")
        return ApiError(
            400,
            f"body: the request body is not valid JSON ({detail})".replace(" ()", ""),
            param="body",
        )
    # Pydantic adds the union member it tried (`str`, `list[str]`) to the location; the
    # last part of an unknown field's location is the client's own key, whatever it holds.
    kept = location[-1:] if kind == "extra_forbidden" else []
    location = [part for part in location[: len(location) - len(kept)] if not _is_type_name(part)]
    location += kept
    param = json_path(location)
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, ArtValueError):  # our own checks know the exact path
        return ApiError(400, str(cause), param=cause.field)
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        message = f"unsupported parameter {param!r}"
    elif kind == "less_than_equal" and param in ("frequency_penalty", "presence_penalty"):
        message = f"{param} is not supported by this engine; leave it at 0"
    named = str(location[0]) if location else param
    if param and not re.match(rf"{re.escape(str(named))}\b", message):  # not "containers"
        message = f"{param}: {message}"
    return ApiError(400, message, param=param)


def _is_type_name(part: int | str) -> bool:
    return isinstance(part, str) and (
        part in ("str", "int", "float", "bool", "dict", "list", "none")
        or "[" in part
        or part.startswith(("literal", "function-", "dict[", "list["))
    )


__all__ = [
    "MAX_JSON_DEPTH",
    "ApiError",
    "ChatCompletionRequest",
    "check_plain_json",
    "check_stop",
    "error_protocol",
    "log_rejected",
    "parse_body",
    "parse_chat_request",
    "read_body",
    "validation_error",
]
