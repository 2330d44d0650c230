"""A trajectory's captured exchanges as conversations: what the trainer, RULER and the
viewer read.

Each answer our endpoint sampled (it carries `prompt_token_ids`, `token_ids`,
`token_logprobs` and `policy_version`) becomes an OpenAI `Choice`: its message is the
answer's text and tool calls in OpenAI chat form, whatever the protocol (Chat
Completions, Completions, Responses, Anthropic Messages), and its `model_extra` holds the
four fields, which is what the trainer trains from. The request's messages come before it
as plain dicts, translated to OpenAI chat messages. An answer without token ids (another
server: a judge, a hosted model) is context: an assistant message, never a trained turn.

Exchanges are grouped into conversations as ART 0.5.23 does: a sampled answer whose
prompt ids begin with a conversation's last prompt and completion ids extends it; any other
(a parallel call, a second choice of one request, a sub-agent) starts a conversation of
its own, holding its whole prompt as context. Answers without ids extend the conversation
whose messages their request begins with. The first conversation is the main one.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.chat.chat_completion import Choice
from openai.types.responses import Response

from .errors import TrajectoryValidationError
from .exchanges import (
    ChatCompletionsExchange,
    CompletionsExchange,
    Exchange,
    MessagesExchange,
    ResponsesExchange,
    SampledTokens,
    TrajectoryExchanges,
    sampled_tokens,
)
from .history import History, MessageOrChoiceField, ToolField, choice_as_message

_PROTOCOL = {
    ChatCompletionsExchange: "chat_completions",
    CompletionsExchange: "completions",
    ResponsesExchange: "responses",
    MessagesExchange: "messages",
}
# Each protocol's reason to stop, as OpenAI's Choice names it.
_FINISH = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "content_filter": "content_filter",
    "function_call": "function_call",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "max_output_tokens": "length",
}


class Rollout(Protocol):
    """What these functions read (and fill) of a trajectory (`art.Trajectory` is one)."""

    exchanges: TrajectoryExchanges
    messages_and_choices: list[MessageOrChoiceField]
    tools: list[ToolField] | None
    additional_histories: list[History]
    logs: list[str]
    initial_policy_version: int | None
    final_policy_version: int | None


@dataclass(frozen=True)
class Answer:
    """One answer of an exchange: as a trained `Choice` (sampled here) or a plain
    assistant message (context), with the ids it was sampled with, if any."""

    item: Choice | dict[str, Any]
    tokens: SampledTokens | None


# --- translation to OpenAI chat form ------------------------------------------------------


def _text(content: object) -> str:
    """The text of a content value in any protocol: a string or a list of text blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict):
                value = block.get("text", block.get("refusal"))
                parts.append(value if isinstance(value, str) else f"[{block.get('type')}]")
        return "".join(parts)
    return json.dumps(content, default=str)


def _call(call_id: object, name: object, arguments: object) -> dict[str, Any]:
    return {
        "id": str(call_id or ""),
        "type": "function",
        "function": {
            "name": str(name or ""),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
        },
    }


def _assistant(text: str | None, calls: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return message


def _chat_request(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(m) for m in request.get("messages") or [] if isinstance(m, dict)]


def _completions_prompt(request: dict[str, Any]) -> str:
    prompt = request.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(token, int) for token in prompt):
        return f"[{len(prompt)} prompt token ids]"
    return json.dumps(prompt, default=str)


def _responses_request(request: dict[str, Any], *, with_instructions: bool = True) -> list[Any]:
    messages: list[dict[str, Any]] = []
    instructions = request.get("instructions")
    if with_instructions and isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    value = request.get("input")
    if isinstance(value, str):
        return [*messages, {"role": "user", "content": value}]
    calls: list[dict[str, Any]] | None = None  # the open assistant turn's tool calls
    for item in value if isinstance(value, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "function_call":
            if calls is None:
                calls = []
                messages.append({"role": "assistant", "content": None, "tool_calls": calls})
            calls.append(_call(item.get("call_id"), item.get("name"), item.get("arguments")))
            continue
        calls = None
        if kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item.get("call_id") or ""),
                    "content": _text(item.get("output")),
                }
            )
        elif kind in (None, "message") and isinstance(item.get("role"), str):
            messages.append({"role": item["role"], "content": _text(item.get("content"))})
        # Reasoning items and built-in tool calls have no chat message of their own.
    return messages


def _messages_request(request: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = request.get("system")
    if system:
        messages.append({"role": "system", "content": _text(system)})
    for raw in request.get("messages") or []:
        if not isinstance(raw, dict):
            continue
        role, content = raw.get("role", "user"), raw.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        text, calls = "", []
        for block in content if isinstance(content, list) else []:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                text += str(block.get("text") or "")
            elif kind == "tool_use":
                calls.append(_call(block.get("id"), block.get("name"), block.get("input")))
            elif kind == "tool_result":
                if text:
                    messages.append({"role": role, "content": text})
                    text = ""
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(block.get("tool_use_id") or ""),
                        "content": _text(block.get("content")),
                    }
                )
        if role == "assistant":
            messages.append(_assistant(text, calls))
        elif text:
            messages.append({"role": role, "content": text})
    return messages


def request_messages(exchange: Exchange) -> list[dict[str, Any]]:
    """The messages `exchange` sent, as OpenAI chat messages (Completions: its prompt as
    one user message)."""
    request = exchange.request
    if isinstance(exchange, ChatCompletionsExchange):
        return _chat_request(request)
    if isinstance(exchange, CompletionsExchange):
        return [{"role": "user", "content": _completions_prompt(request)}]
    if isinstance(exchange, ResponsesExchange):
        return _responses_request(request)
    return _messages_request(request)


def request_tools(exchange: Exchange) -> list[dict[str, Any]] | None:
    """The tools `exchange` offered, as OpenAI chat function tools (others are left out)."""
    tools = exchange.request.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    if isinstance(exchange, ChatCompletionsExchange):
        chat = [dict(t) for t in tools if isinstance(t, dict) and t.get("type") == "function"]
        return chat or None
    schema = "input_schema" if isinstance(exchange, MessagesExchange) else "parameters"
    converted = []
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type", "function") not in ("function", "custom"):
            continue  # a hosted tool (web search, ...): nothing the chat form can name
        parameters = tool.get(schema)
        function: dict[str, Any] = {"name": tool.get("name"), "parameters": parameters or {}}
        if tool.get("description"):
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    return converted or None


def _answer_messages(exchange: Exchange) -> list[tuple[int, dict[str, Any], str | None]]:
    """Each answer of `exchange` as (choice index, assistant message, finish reason)."""
    response = exchange.response
    if isinstance(response, ChatCompletion):
        return [
            (
                choice.index,
                _assistant(
                    choice.message.content,
                    [call.model_dump() for call in choice.message.tool_calls or []],
                ),
                choice.finish_reason,
            )
            for choice in sorted(response.choices, key=lambda c: c.index)
        ]
    if isinstance(response, Completion):
        return [
            (choice.index, _assistant(choice.text, []), choice.finish_reason)
            for choice in sorted(response.choices, key=lambda c: c.index)
        ]
    if isinstance(response, Response):
        text, calls = "", []
        for item in response.output:
            if item.type == "message":
                text += _text([part.model_dump() for part in item.content])
            elif item.type == "function_call":
                calls.append(_call(item.call_id, item.name, item.arguments))
        reason = response.incomplete_details.reason if response.incomplete_details else None
        finish = reason or ("tool_calls" if calls else "stop")
        return [(0, _assistant(text, calls), finish)]
    text, calls = "", []
    for block in response.content:
        if block.type == "text":
            text += block.text
        elif block.type == "tool_use":
            calls.append(_call(block.id, block.name, block.input))
    return [(0, _assistant(text, calls), response.stop_reason)]


def answers(exchange: Exchange) -> list[Answer]:
    """The answers of `exchange`, in choice order: a `Choice` carrying our four fields
    where our endpoint sampled it, else the assistant message (context)."""
    # Chat and Completions carry ids per choice; Responses and Messages on the response.
    per_choice = isinstance(exchange.response, ChatCompletion | Completion)
    sampled: dict[int, SampledTokens] = {}
    holders = exchange.response.choices if per_choice else [exchange.response]  # type: ignore[union-attr]
    for position, holder in enumerate(holders):
        found = next(_sampled_one(exchange, holder), None)
        if found is not None:
            sampled[getattr(holder, "index", position) if per_choice else 0] = found
    result = []
    for index, message, finish in _answer_messages(exchange):
        tokens = sampled.get(index)
        if tokens is None:
            result.append(Answer(message, None))
            continue
        choice = Choice.model_validate(
            {
                "index": index,
                "message": message,
                "finish_reason": _FINISH.get(finish or "stop", "stop"),
                "logprobs": None,
                "prompt_token_ids": tokens.prompt_token_ids,
                "token_ids": tokens.token_ids,
                "token_logprobs": tokens.token_logprobs,
                "policy_version": tokens.policy_version,
            }
        )
        result.append(Answer(choice, tokens))
    return result


def _sampled_one(exchange: Exchange, holder: Any) -> Iterator[SampledTokens]:
    # `sampled_tokens` walks every holder of an exchange; pick this holder's ids out.
    extra = holder.model_extra or {}
    for tokens in sampled_tokens(exchange):
        if (extra.get("prompt_token_ids"), extra.get("token_ids")) == (
            tokens.prompt_token_ids,
            tokens.token_ids,
        ):
            yield tokens
            return


# --- grouping into conversations ---------------------------------------------------------


@dataclass
class _Conversation:
    items: list[Choice | dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    keys: list[str] = field(default_factory=list)  # each message's key, answers included
    tokens: list[int] | None = None  # the last sampled prompt + completion ids
    text: str | None = None  # a Completions conversation's prompt and answers so far


def _key(message: dict[str, Any]) -> str:
    calls = [(call.get("function") or {}).get("name") for call in message.get("tool_calls") or []]
    return json.dumps([message.get("role"), _text(message.get("content")), calls])


def _is_prefix(prefix: Sequence[object], value: Sequence[object]) -> bool:
    return len(prefix) <= len(value) and list(value[: len(prefix)]) == list(prefix)


def _extended(
    found: list[_Conversation], keys: list[str], tokens: SampledTokens | None, claimed: set[int]
) -> _Conversation | None:
    if tokens is not None:
        ids = tokens.prompt_token_ids
        matches = [
            c
            for c in found
            if c.tokens is not None and id(c) not in claimed and _is_prefix(c.tokens, ids)
        ]
        return max(matches, key=lambda c: len(c.tokens or []), default=None)
    matches = [c for c in found if id(c) not in claimed and c.keys and _is_prefix(c.keys, keys)]
    return max(matches, key=lambda c: len(c.keys), default=None)


def _new_messages(
    exchange: Exchange, conversation: _Conversation, messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """What `exchange` sent beyond what `conversation` already holds."""
    if isinstance(exchange, CompletionsExchange):
        prompt = _completions_prompt(exchange.request)
        if conversation.text is not None and prompt.startswith(conversation.text):
            delta = prompt[len(conversation.text) :]
            return [{"role": "user", "content": delta}] if delta else []
        return messages
    if isinstance(exchange, ResponsesExchange) and exchange.request.get("previous_response_id"):
        return _responses_request(exchange.request, with_instructions=False)
    return messages[len(conversation.keys) :]


def _conversations(exchanges: Sequence[Exchange]) -> list[_Conversation]:
    found: list[_Conversation] = []
    for exchange in sorted(exchanges, key=lambda e: (e.start_time, e.end_time)):
        messages = request_messages(exchange)
        keys = [_key(message) for message in messages]
        tools = request_tools(exchange)
        claimed: set[int] = set()  # one answer of a request extends a conversation, once
        for answer in answers(exchange):
            conversation = _extended(found, keys, answer.tokens, claimed)
            if conversation is None:
                conversation = _Conversation()
                found.append(conversation)
                new = messages
            else:
                new = _new_messages(exchange, conversation, messages)
            claimed.add(id(conversation))
            conversation.items.extend(dict(message) for message in new)
            conversation.items.append(answer.item)
            conversation.tools = tools if tools is not None else conversation.tools
            answer_message = (
                choice_as_message(answer.item) if isinstance(answer.item, Choice) else answer.item
            )
            conversation.keys = [*keys, _key(dict(answer_message))]
            if answer.tokens is not None:
                conversation.tokens = answer.tokens.prompt_token_ids + answer.tokens.token_ids
            if isinstance(exchange, CompletionsExchange):
                conversation.text = _completions_prompt(exchange.request) + _text(
                    answer_message.get("content")
                )
    return found


def selected_exchanges(trajectory: Rollout, model: str | None = None) -> list[Exchange]:
    """The exchanges of `trajectory` with `model` (a name or shell pattern; None: every
    one), in the order they were sent."""
    exchanges = trajectory.exchanges
    if model is not None:
        exchanges = exchanges.model_copy(include_models=model)
    return exchanges.all()


def histories_of(trajectory: Rollout, *, model: str | None = None) -> list[History]:
    """The conversations of `trajectory`, the main one first.

    An exchange trajectory's are built from its exchanges (those of `model`, a name or a
    shell pattern, where given); a trajectory built by hand gives its
    `messages_and_choices` and then its `additional_histories`.
    """
    if not trajectory.exchanges:
        if model is not None:
            raise TrajectoryValidationError(
                "model",
                "a trajectory built from messages_and_choices names no model per call",
                "Leave model out for it; model= selects among captured exchanges",
            )
        main = History(messages_and_choices=trajectory.messages_and_choices, tools=trajectory.tools)
        return [main, *trajectory.additional_histories]
    if model is None:  # the whole trajectory's: parsed once while its exchanges stay
        return list(_built_histories(trajectory.exchanges))
    selected = selected_exchanges(trajectory, model)
    if not selected:
        raise TrajectoryValidationError(
            "model",
            f"the trajectory has no exchange with a model matching {model!r} (it has "
            f"{sorted({e.model or '?' for e in trajectory.exchanges.all()})})",
            "Pass one of those names, a shell pattern matching one, or leave model out",
        )
    return _histories(selected)


def _histories(exchanges: Sequence[Exchange]) -> list[History]:
    return [History(messages_and_choices=c.items, tools=c.tools) for c in _conversations(exchanges)]


# The histories built from each `TrajectoryExchanges` (by id, dropped when it is
# collected), with the exchanges they were built from. Outside the model: pydantic
# compares private attributes, so a cache there would make equal trajectories unequal.
_BUILT: dict[int, tuple[tuple[tuple[int, datetime], ...], list[History]]] = {}


def _built_histories(exchanges: TrajectoryExchanges) -> list[History]:
    """`_histories` of every exchange, built once while the lists hold the same exchanges
    (by identity and start time): a training walk reads a trajectory's conversations to
    check it and to tokenize it, and parses its exchanges once for both. An exchange
    changed in place is not seen; one added, removed or replaced is."""
    every = exchanges.all()
    key = tuple((id(exchange), exchange.start_time) for exchange in every)
    kept = _BUILT.get(id(exchanges))
    if kept is not None and kept[0] == key:
        return kept[1]
    if kept is None:
        weakref.finalize(exchanges, _BUILT.pop, id(exchanges), None)
    built = _histories(every)
    _BUILT[id(exchanges)] = (key, built)
    return built


# --- what is not trained, and the policy versions ---------------------------------------


def untrained_exchanges(trajectory: Rollout) -> list[str]:
    """A line per exchange of `trajectory` with an answer that will not be trained, and why."""
    lines = []
    for position, exchange in enumerate(trajectory.exchanges.all()):
        found = answers(exchange)
        context = sum(1 for answer in found if answer.tokens is None)
        if not context:
            continue
        which = "its answer" if len(found) == 1 else f"{context} of its {len(found)} answers"
        lines.append(
            f"exchange {position} ({_PROTOCOL[type(exchange)]}, model {exchange.model!r}, "
            f"sent {exchange.start_time.isoformat()}): untrained context: {which} carries "
            "no sampled token ids (prompt_token_ids, token_ids), so it came from a server "
            "other than this model's endpoint"
        )
    return lines


def note_untrained(trajectory: Rollout) -> None:
    """Add `untrained_exchanges`'s lines to the trajectory's logs (each once)."""
    for line in untrained_exchanges(trajectory):
        if line not in trajectory.logs:
            trajectory.logs.append(line)


def has_sampled_tokens(trajectory: Rollout) -> bool:
    """Whether an exchange of `trajectory` carries an answer sampled with its token ids."""
    return any(
        tokens.token_ids
        for exchange in trajectory.exchanges.all()
        for tokens in sampled_tokens(exchange)
    )


def policy_versions(trajectory: Rollout) -> list[int]:
    """The `policy_version` of each sampled answer of the trajectory's exchanges."""
    return [
        tokens.policy_version
        for exchange in trajectory.exchanges.all()
        for tokens in sampled_tokens(exchange)
        if tokens.policy_version is not None
    ]


def fill_policy_versions(trajectory: Rollout) -> None:
    """Set `initial_`/`final_policy_version` from the exchanges' versions where unset."""
    versions = policy_versions(trajectory)
    if not versions:
        return
    if trajectory.initial_policy_version is None:
        trajectory.initial_policy_version = min(versions)
    if trajectory.final_policy_version is None:
        trajectory.final_policy_version = max(versions)


__all__ = [
    "Answer",
    "answers",
    "fill_policy_versions",
    "has_sampled_tokens",
    "histories_of",
    "note_untrained",
    "policy_versions",
    "request_messages",
    "request_tools",
    "selected_exchanges",
    "untrained_exchanges",
]
