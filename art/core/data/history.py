"""Messages, choices and tools as a trajectory holds them, and `History`: one conversation.

Below the trajectory model: `art.core.data.exchange_histories` builds `History` objects from
captured exchanges, and `Trajectory` holds its main conversation and its
`additional_histories` in the same fields.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from openai.types.chat import ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    SerializationInfo,
)

from .errors import TrajectoryValidationError
from .types import Message, MessageOrChoice, Messages, Tool

_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_ROLES_NEEDING_CONTENT = ("system", "developer", "user", "tool")


# --- validation -------------------------------------------------------------------------
# Written by hand rather than left to pydantic's union validation of the OpenAI TypedDicts:
# that validation drops unknown keys, turns `tool_calls` into a one-shot iterator, and
# reports a missing role as a wall of union errors instead of one sentence.


def check_message_or_choice(value: object, where: str) -> dict[str, Any] | Choice:
    """Return `value` as a message dict or a `Choice`, or raise naming `where`."""
    if isinstance(value, Choice):
        return value
    if isinstance(value, ChatCompletionMessage):
        # `completion.choices[0].message` appended as is: keep it, as context.
        return value.model_dump(exclude_none=True, exclude_defaults=True) | {"role": "assistant"}
    if not isinstance(value, Mapping):
        raise TrajectoryValidationError(
            where,
            f"expected a message dict or an OpenAI Choice, got {type(value).__name__}",
            "Append `completion.choices[0]` for model output, or a dict such as "
            "{'role': 'user', 'content': '...'}",
        )
    if (
        "role" not in value
        and "message" in value
        and ("finish_reason" in value or "index" in value)
    ):
        return Choice.model_validate(dict(value))  # a Choice read back from JSON
    role = value.get("role")
    if role is None:
        raise TrajectoryValidationError(
            where,
            "message has no 'role'",
            f"Give every message a role, one of {', '.join(_ROLES)}",
        )
    if role not in _ROLES:
        raise TrajectoryValidationError(
            f"{where}.role", f"unknown role {role!r}", f"Use one of {', '.join(_ROLES)}"
        )
    if role in _ROLES_NEEDING_CONTENT and "content" not in value:
        raise TrajectoryValidationError(
            where, f"a {role!r} message has no 'content'", "Add a 'content' string"
        )
    if role == "tool" and "tool_call_id" not in value:
        raise TrajectoryValidationError(
            where,
            "a 'tool' message has no 'tool_call_id'",
            "Set it to the id of the assistant tool call it answers",
        )
    return dict(value)


def check_tool(value: object, where: str) -> dict[str, Any]:
    """Return `value` as an OpenAI tool schema dict, or raise naming `where`."""
    if not isinstance(value, Mapping):
        raise TrajectoryValidationError(
            where, f"expected a tool schema dict, got {type(value).__name__}", _TOOL_FIX
        )
    function = value.get("function")
    if value.get("type", "function") != "function" or not isinstance(function, Mapping):
        raise TrajectoryValidationError(where, "not an OpenAI function tool", _TOOL_FIX)
    if not isinstance(function.get("name"), str):
        raise TrajectoryValidationError(f"{where}.function.name", "missing", _TOOL_FIX)
    return dict(value)


_TOOL_FIX = "Use {'type': 'function', 'function': {'name': ..., 'parameters': {...}}}"


def _validate_message_or_choice(value: object) -> dict[str, Any] | Choice:
    return check_message_or_choice(value, "message")


def _serialize_message_or_choice(
    value: dict[str, Any] | Choice, info: SerializationInfo
) -> dict[str, Any]:
    if isinstance(value, Choice):
        return value.model_dump(mode=info.mode)
    return value


MessageOrChoiceField = Annotated[
    MessageOrChoice,
    PlainValidator(_validate_message_or_choice),
    PlainSerializer(_serialize_message_or_choice),
]
ToolField = Annotated[Tool, PlainValidator(lambda value: check_tool(value, "tool"))]


def choice_as_message(choice: Choice) -> Message:
    """The assistant message a `Choice` stands for, tool calls included."""
    message: dict[str, Any] = {"role": "assistant", "content": choice.message.content}
    if choice.message.tool_calls:
        message["tool_calls"] = [call.model_dump() for call in choice.message.tool_calls]
    return message  # type: ignore[return-value]


def messages_of(messages_and_choices: Iterable[MessageOrChoice]) -> Messages:
    """Messages ready to send to a chat endpoint: each `Choice` as its assistant message."""
    return [
        choice_as_message(item) if isinstance(item, Choice) else item
        for item in messages_and_choices
    ]


class History(BaseModel):
    """A second conversation inside one rollout (a sub-agent, a summarizer call)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    messages_and_choices: list[MessageOrChoiceField] = Field(default_factory=list)
    tools: list[ToolField] | None = None

    def messages(self) -> Messages:
        return messages_of(self.messages_and_choices)


__all__ = [
    "History",
    "MessageOrChoiceField",
    "ToolField",
    "check_message_or_choice",
    "check_tool",
    "choice_as_message",
    "messages_of",
]
