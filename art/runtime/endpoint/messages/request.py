"""What an Anthropic Messages request may hold, as Anthropic documents it, less what is
refused: each field and content block a pydantic model that names what it cannot honour.

Refused with a 400 naming the field: images and documents (text-only models), thinking,
prompt caching (`cache_control`), server tools, `top_k`, service tiers, and any field it
does not know.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

# Top-level fields the Anthropic SDK can send that this endpoint cannot honour; null is
# taken as absent. Each says why, and what to send instead.
_REFUSED = {
    "top_k": "top_k is not supported by this engine (it samples with temperature and top_p); "
    "remove it",
    "cache_control": "prompt caching is not offered by this endpoint; remove cache_control",
    "container": "containers (for server tools) are not offered by this endpoint; remove it",
    "diagnostics": "prompt-cache diagnostics are not offered by this endpoint; remove it",
    "inference_geo": "inference regions are not offered by this endpoint; remove it",
    "service_tier": "this endpoint has a single service tier; remove service_tier",
    "speed": "speed modes are not offered by this endpoint; remove speed",
    "user_profile_id": "user profiles are not offered by this endpoint; remove user_profile_id",
    "workspace_id": "workspaces are not offered by this endpoint; remove workspace_id",
}
_NO_CACHE = "prompt caching is not offered by this endpoint; remove cache_control"
_TOOL_NAME = r"^[a-zA-Z0-9_-]{1,128}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Cacheable(_Strict):
    cache_control: Any = None

    @field_validator("cache_control")
    @classmethod
    def _no_cache(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError(_NO_CACHE)
        return value


class TextBlock(_Cacheable):
    type: Literal["text"]
    text: str
    citations: list[Any] | None = None  # the SDK may send back a response's `null`

    @field_validator("citations")
    @classmethod
    def _no_citations(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("citations are not supported by this endpoint; send plain text")
        return value


class _DirectCaller(_Strict):
    type: Literal["direct"]


class ToolUseBlock(_Cacheable):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    caller: _DirectCaller | None = None  # as a response's block is sent back
    toolset_name: None = None


class ToolResultBlock(_Cacheable):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[dict[str, Any]] = ""  # text blocks, read by `chat._blocks`
    is_error: bool = False
    toolset_name: None = None


Block = TextBlock | ToolUseBlock | ToolResultBlock
BLOCKS: dict[str, type[Block]] = {
    "text": TextBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
}
ALLOWED_BLOCKS = {  # the block kinds a turn of each role holds
    "user": ("text", "tool_result"),
    "assistant": ("text", "tool_use"),
    "system": ("text",),
}


class Message(_Strict):
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]] = Field(min_length=1)  # blocks, read by `chat._blocks`


class Tool(_Cacheable):
    type: Literal["custom"] | None = None
    name: str = Field(pattern=_TOOL_NAME)
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None

    @field_validator("type", mode="before")
    @classmethod
    def _custom_only(cls, value: Any) -> Any:
        if value not in (None, "custom"):
            raise ValueError(
                f"server tools ({value!r}) are not offered by this endpoint; only custom tools, "
                'given as {"name", "description", "input_schema"}'
            )
        return value

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type") != "object":
            raise ValueError('a tool\'s input_schema is a JSON schema with "type": "object"')
        return value

    @field_validator("strict")
    @classmethod
    def _not_strict(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError(
                "strict tools are not offered: inputs are constrained to the schema only under "
                'tool_choice {"type": "any"} or {"type": "tool"}; remove strict'
            )
        return value


class _ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _name_for_tool(self) -> _ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError('name is given with type "tool", and only then')
        return self


class _Metadata(_Strict):
    user_id: str | None = None  # an end-user id for the caller's own bookkeeping


class _JsonFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class _OutputConfig(_Strict):
    format: _JsonFormat | None = None
    effort: None = None


class MessagesRequest(_Strict):
    """A Messages API request, as Anthropic documents it, less what is refused."""

    model: str
    max_tokens: int = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: _ToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: float = Field(default=1.0, ge=0, le=1, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    stream: bool = False
    metadata: _Metadata | None = None
    thinking: dict[str, Any] | None = None
    output_config: _OutputConfig | None = None
    top_k: Any = None
    cache_control: Any = None
    container: Any = None
    diagnostics: Any = None
    inference_geo: Any = None
    service_tier: Any = None
    speed: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None

    @field_validator(*_REFUSED)
    @classmethod
    def _refused(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            raise ValueError(_REFUSED[str(info.field_name)])
        return value

    @field_validator("thinking")
    @classmethod
    def _thinking_off(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value != {"type": "disabled"}:
            raise ValueError(
                "extended thinking is not offered by this endpoint; omit thinking or send "
                '{"type": "disabled"}'
            )
        return value

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not all(value):
            raise ValueError("stop sequences must not be empty strings")
        return value

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, tools: list[Tool] | None) -> list[Tool] | None:
        names = [tool.name for tool in tools or []]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(f"tools[{index}].name: {name!r} names two tools; names are unique")
        return tools


__all__ = [
    "ALLOWED_BLOCKS",
    "BLOCKS",
    "Block",
    "Message",
    "MessagesRequest",
    "TextBlock",
    "Tool",
    "ToolResultBlock",
    "ToolUseBlock",
]
