"""A Messages request read: parsed, then translated into a chat request, and a chat error
named back in its terms.

`tool_use` blocks become OpenAI `tool_calls`, each `tool_result` a `tool` message (its
text prefixed `Error: ` when `is_error`), consecutive turns of one role are combined as
Anthropic combines them, and `tool_choice` any/tool/none becomes required/function/none.
A conversation ending with an assistant turn is a prefill: the answer continues its text
(the chat request's `continue_final_message`), and holds only what the model wrote.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from ..jobs import ready_job
from ..request import ApiError, ChatCompletionRequest, parse_body, validation_error
from ..response import Job, Route
from .request import (
    ALLOWED_BLOCKS,
    BLOCKS,
    Block,
    Message,
    MessagesRequest,
    TextBlock,
    Tool,
    ToolResultBlock,
    ToolUseBlock,
)

_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # "tool": a function


def parse_messages_request(raw: bytes) -> tuple[MessagesRequest, ChatCompletionRequest]:
    """The request in `raw` and the chat request it reads as, or a 400 naming the field.

    Synchronous (it validates every block): the route calls it in a worker thread.
    """
    body = parse_body(raw, MessagesRequest)
    return body, _chat_request(body)


def _chat_request(body: MessagesRequest) -> ChatCompletionRequest:
    tool_choice: str | dict[str, Any] | None = None
    choice = body.tool_choice
    if choice is not None:
        if choice.type in ("any", "tool") and not body.tools:
            raise ApiError(
                400,
                f'tool_choice: {{"type": "{choice.type}"}} needs tools; give tools or use "auto"',
                param="tool_choice",
            )
        if choice.type == "tool" and choice.name not in [tool.name for tool in body.tools or []]:
            raise ApiError(
                400, f"tool_choice.name: {choice.name!r} is not in tools", param="tool_choice.name"
            )
        forced = {"type": "function", "function": {"name": choice.name}}
        tool_choice = forced if choice.type == "tool" else _TOOL_CHOICES[choice.type]
    response_format = None
    if body.output_config is not None and body.output_config.format is not None:
        schema = body.output_config.format.json_schema
        response_format = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema, "strict": True},
        }
    messages = _chat_messages(body)
    continues = messages[-1]["role"] == "assistant"  # a prefill: the answer continues it
    chat = ChatCompletionRequest(
        model=body.model,
        messages=messages,
        add_generation_prompt=not continues,
        continue_final_message=continues,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        tools=[_function_tool(tool) for tool in body.tools] if body.tools else None,
        tool_choice=tool_choice,
        parallel_tool_calls=not (choice is not None and choice.disable_parallel_tool_use),
        stream=body.stream,
        response_format=response_format,
        user=body.metadata.user_id if body.metadata is not None else None,
    )
    # Anthropic bounds stop sequences by count only loosely; OpenAI's limit of four is not ours.
    return chat.model_copy(update={"stop": body.stop_sequences})


def _function_tool(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = tool.input_schema
    return {"type": "function", "function": function}


def _chat_messages(body: MessagesRequest) -> list[dict[str, Any]]:
    """The conversation as chat messages: system first, then each turn."""
    chat: list[dict[str, Any]] = []
    if body.system is not None:
        system = body.system
        chat.append(
            {"role": "system", "content": system if isinstance(system, str) else _parts(system)}
        )
    turns = _turns(body.messages)
    if turns and turns[-1][0] == "assistant":
        _check_prefill(turns[-1][1], len(body.messages) - 1)
    called: set[str] = set()
    for role, blocks in turns:
        if role == "assistant":
            chat.append(_assistant(blocks))
            called.update(block.id for block, _ in blocks if isinstance(block, ToolUseBlock))
        elif role == "system":
            chat.append({"role": "system", "content": _parts(_texts(blocks))})
        else:
            chat.extend(_user(blocks, called))
    return chat


_Turn = tuple[str, list[tuple[Block, str]]]  # a role, and its blocks with their paths


def _check_prefill(blocks: list[tuple[Block, str]], index: int) -> None:
    """A last assistant turn is text the answer continues, as Anthropic reads it: no
    tool_use to continue, and no trailing whitespace (Anthropic refuses it too)."""
    for block, path in blocks:
        if isinstance(block, ToolUseBlock):
            raise ApiError(
                400,
                f"{path}: the conversation ends with an assistant turn holding a tool_use "
                "block; only text can be continued: send its tool_result in a user turn",
                param=f"{path}.type",
            )
    text = "".join(block.text for block in _texts(blocks))
    if text != text.rstrip():
        raise ApiError(
            400,
            f"messages[{index}].content: final assistant content cannot end with trailing "
            "whitespace",
            param=f"messages[{index}].content",
        )


def _turns(messages: Sequence[Message]) -> list[_Turn]:
    """The messages' blocks, read and checked; consecutive turns of one role combined."""
    turns: list[_Turn] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}].content"
        content = message.content
        items = [{"type": "text", "text": content}] if isinstance(content, str) else content
        blocks = _blocks(items, where, ALLOWED_BLOCKS[message.role])
        if turns and turns[-1][0] == message.role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((message.role, blocks))
    return turns


def _blocks(items: Sequence[Any], where: str, allowed: Sequence[str]) -> list[tuple[Block, str]]:
    """`items` read as content blocks of the kinds `allowed`, each with its path."""
    blocks: list[tuple[Block, str]] = []
    for index, item in enumerate(items):
        path = f"{where}[{index}]"
        kind = item.get("type") if isinstance(item, dict) else None
        if kind not in allowed:
            raise ApiError(400, _unsupported_block(kind, path, allowed), param=f"{path}.type")
        try:
            blocks.append((BLOCKS[str(kind)].model_validate(item), path))
        except ValidationError as error:
            prefix = _path_parts(path)
            raise validation_error(
                [{**e, "loc": (*prefix, *e["loc"])} for e in error.errors()]
            ) from error
    return blocks


def _unsupported_block(kind: object, path: str, allowed: Sequence[str]) -> str:
    takes = f"this content takes {' and '.join(allowed)} blocks"
    if kind in ("image", "document", "search_result"):
        return (
            f"{path}: {kind} blocks are not supported: this endpoint serves text-only models; "
            f"send the content as text ({takes})"
        )
    if kind in ("thinking", "redacted_thinking"):
        return f"{path}: {kind} blocks are not supported: thinking is not offered ({takes})"
    if kind in BLOCKS:
        return f"{path}: {kind} blocks do not belong here; {takes}"
    return f"{path}: {kind!r} blocks are not supported by this endpoint; {takes}"


def _path_parts(path: str) -> list[int | str]:
    """`messages[2].content[0]` as ("messages", 2, "content", 0)."""
    return [int(part) if part.isdigit() else part for part in re.findall(r"[^.\[\]]+", path)]


def _texts(blocks: Sequence[tuple[Block, str]]) -> list[TextBlock]:
    return [block for block, _ in blocks if isinstance(block, TextBlock)]


def _parts(blocks: Sequence[TextBlock]) -> list[dict[str, Any]]:
    """Text blocks as OpenAI text parts: the rendering joins them or keeps them, as its
    template reads content."""
    return [{"type": "text", "text": block.text} for block in blocks]


def _assistant(blocks: list[tuple[Block, str]]) -> dict[str, Any]:
    text = "".join(block.text for block in _texts(blocks))
    calls = [
        {
            "id": block.id,
            "type": "function",
            "function": {"name": block.name, "arguments": json.dumps(block.input)},
        }
        for block, _ in blocks
        if isinstance(block, ToolUseBlock)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: list[tuple[Block, str]], called: set[str]) -> list[dict[str, Any]]:
    """A user turn: a `tool` message per tool result, a user message per run of text."""
    chat: list[dict[str, Any]] = []
    text: list[TextBlock] = []
    for block, path in blocks:
        if isinstance(block, TextBlock):
            text.append(block)
            continue
        assert isinstance(block, ToolResultBlock)
        if text:
            chat.append({"role": "user", "content": _parts(text)})
            text = []
        if block.tool_use_id not in called:
            raise ApiError(
                400,
                f"{path}.tool_use_id: {block.tool_use_id!r} answers no tool_use block of an "
                "earlier assistant turn",
                param=f"{path}.tool_use_id",
            )
        chat.append(
            {"role": "tool", "tool_call_id": block.tool_use_id, "content": _result(block, path)}
        )
    if text:
        chat.append({"role": "user", "content": _parts(text)})
    return chat


def _result(block: ToolResultBlock, path: str) -> str:
    if isinstance(block.content, str):
        text = block.content
    else:
        parts = _blocks(block.content, f"{path}.content", ("text",))
        text = "\n".join(part.text for part in _texts(parts))
    return f"Error: {text}" if block.is_error else text


async def ready(chat: ChatCompletionRequest, route: Route) -> Job:
    """`jobs.ready_job`, its errors naming the Messages fields."""
    try:
        return await ready_job(chat, route)
    except ApiError as error:
        raise _renamed(error) from error


def _renamed(error: ApiError) -> ApiError:
    """A chat-shaped error from rendering or compiling, with this protocol's field names."""
    renames = [
        (r"^tools\[(\d+)\]\.function\.parameters", r"tools[\1].input_schema"),
        (r"^response_format", "output_config.format"),
    ]
    param, message = error.param, error.message
    for pattern, name in renames:
        if param is not None and re.match(pattern, param):
            param = re.sub(pattern, name, param)
            message = re.sub(pattern, name, message)
    return ApiError(error.status, message, param=param, code=error.code)


__all__ = ["parse_messages_request", "ready"]
