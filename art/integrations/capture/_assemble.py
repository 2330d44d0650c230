"""Recorded calls grouped into conversations, and conversations into a Trajectory.

A call extends a conversation when its request begins with that conversation's messages
followed by the conversation's last answer, with the same tools offered: an agent loop
sends its history back with the tool results appended. Any other call (a sub-agent, a
summarizer, a branch that rewrote the history) starts a conversation of its own. The
first conversation to start is the trajectory's `messages_and_choices`; the others are
its `additional_histories`. The trainer trains on all of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from openai.types.chat.chat_completion import Choice

from ...core.data.history import History, choice_as_message
from ...core.data.trajectories import Trajectory
from ._recorder import RecordedCall


@dataclass
class Conversation:
    """One conversation: its messages and choices, and the tools it was offered."""

    items: list[dict[str, Any] | Choice] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    keys: list[str] = field(default_factory=list)  # what the next request must begin with


def conversations(calls: list[RecordedCall]) -> list[Conversation]:
    """The conversations of `calls` (given in the order they were sent), oldest first."""
    found: list[Conversation] = []
    for call in calls:
        keys = [_key(message) for message in call.messages]
        tools_key = _canonical(call.tools)
        extended = [
            conversation
            for conversation in found
            if keys[: len(conversation.keys)] == conversation.keys
            and _canonical(conversation.tools) == tools_key
        ]
        if extended:
            conversation = max(extended, key=lambda c: len(c.keys))
        else:
            conversation = Conversation(tools=call.tools)
            found.append(conversation)
        conversation.items.extend(call.messages[len(conversation.keys) :])
        conversation.items.append(call.choice)
        conversation.keys = [*keys, _key(dict(choice_as_message(call.choice)))]
    return found


def fill(trajectory: Trajectory, calls: list[RecordedCall], *, keep: int = 0) -> None:
    """Put the conversations of `calls` into `trajectory`.

    The first `keep` additional histories (the user's own) stay ahead of the recorded ones.
    """
    found = conversations(calls)
    if not found:
        return
    main, *others = found
    trajectory.messages_and_choices = main.items  # type: ignore[assignment]
    trajectory.tools = main.tools  # type: ignore[assignment]
    trajectory.additional_histories = [
        *trajectory.additional_histories[:keep],
        *(History(messages_and_choices=c.items, tools=c.tools) for c in others),
    ]


def _key(message: dict[str, Any]) -> str:
    """What identifies a message across frameworks, which re-serialize what they send back.

    Tool-call ids are left out (some frameworks mint their own) and arguments are compared
    as parsed JSON (spacing differs); empty content is the same whether None or "".
    """
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text is what was said
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        calls.append([function.get("name"), _parsed(function.get("arguments"))])
    return _canonical([message.get("role"), content or "", calls, message.get("tool_call_id")])


def _parsed(arguments: object) -> object:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments  # not JSON: compared as the text it is
    return arguments


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
