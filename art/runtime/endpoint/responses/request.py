"""What a `POST /v1/responses` body may hold: OpenAI's fields, the ones we cannot honour
refused naming them, unless they are unset or at OpenAI's default."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..request import ApiError, parse_body

# OpenAI's limits on `metadata` (its API reference, "metadata").
_METADATA_KEYS, _METADATA_KEY_CHARS, _METADATA_VALUE_CHARS = 16, 64, 512


class ResponsesRequest(BaseModel):
    """A `POST /v1/responses` body: OpenAI's fields, the ones we cannot honour refused."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[Any] | None = None
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None  # end-user ids for the caller's own bookkeeping, echoed back
    safety_identifier: str | None = None
    text: dict[str, Any] | None = None
    # Refused unless unset or at their default (`_UNSUPPORTED` says why each is).
    reasoning: Any = None
    include: Any = None
    background: Any = None
    truncation: Any = None
    top_logprobs: Any = None
    max_tool_calls: Any = None
    service_tier: Any = None
    stream_options: Any = None
    prompt: Any = None
    conversation: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    context_management: Any = None
    moderation: Any = None
    image: Any = None
    access_programs: Any = None

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is not None and (
            len(metadata) > _METADATA_KEYS
            or any(len(key) > _METADATA_KEY_CHARS for key in metadata)
            or any(len(value) > _METADATA_VALUE_CHARS for value in metadata.values())
        ):
            raise ValueError(
                f"at most {_METADATA_KEYS} keys of at most {_METADATA_KEY_CHARS} characters, "
                f"values of at most {_METADATA_VALUE_CHARS}"
            )
        return metadata


def _unset_or(*defaults: object) -> Callable[[object], bool]:
    return lambda value: value is None or any(value == default for default in defaults)


def _no_reasoning(value: object) -> bool:
    return value is None or (isinstance(value, dict) and all(v is None for v in value.values()))


# Each parameter we cannot honour: the values that ask nothing of us, and why others are refused.
_UNSUPPORTED: dict[str, tuple[Callable[[object], bool], str]] = {
    "reasoning": (_no_reasoning, "these models do not reason apart from their answer"),
    "include": (_unset_or([]), "there is nothing extra to include; send [] or leave it out"),
    "background": (_unset_or(False), "responses run in the foreground only"),
    "truncation": (_unset_or("disabled"), "a prompt over the context is refused, not cut"),
    "top_logprobs": (_unset_or(0), "the sampled tokens' logprobs are in `token_logprobs`"),
    "max_tool_calls": (_unset_or(), "tool calls are not counted across a response"),
    "service_tier": (_unset_or("auto", "default"), "there is one service tier"),
    "stream_options": (
        _unset_or({}, {"include_obfuscation": False}),
        "stream events are not obfuscated; send include_obfuscation false",
    ),
    "prompt": (_unset_or(), "there are no stored prompt templates"),
    "conversation": (_unset_or(), "use previous_response_id to continue a conversation"),
    "prompt_cache_key": (_unset_or(), "prompt caching is not offered"),
    "prompt_cache_retention": (_unset_or(), "prompt caching is not offered"),
    "prompt_cache_options": (_unset_or(), "prompt caching is not offered"),
    "context_management": (_unset_or(), "the context is not compacted"),
    "moderation": (_unset_or(), "moderation is not offered"),
    "image": (_unset_or(), "these models do not make images"),
    "access_programs": (_unset_or(), "there are no access programs"),
}


def parse_responses_request(raw: bytes) -> ResponsesRequest:
    """The validated request in `raw` (a JSON body), or a 400 naming the bad value."""
    body = parse_body(raw, ResponsesRequest)
    for name, (accepted, why) in _UNSUPPORTED.items():
        if not accepted(getattr(body, name)):
            raise ApiError(
                400, f"{name}: not supported by this endpoint ({why}); leave it unset", param=name
            )
    return body


__all__ = ["ResponsesRequest", "parse_responses_request"]
