"""Prompt rendering with tools, and parsing tool calls out of sampled text.

SmolLM2-Instruct's own chat template is ChatML without tool support. For ChatML models
whose template ignores tools, we render with `TOOL_CHATML_TEMPLATE`: the tool schemas go
in the system turn, the model calls a tool by writing `<tool_call>{json}</tool_call>`,
and tool results come back as user turns wrapped in `<tool_response>`. The same template
renders earlier calls, so a multi-turn conversation reads the way the model wrote it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jinja2
import jinja2.nodes

from ..core.data import dev

DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

TOOL_CHATML_TEMPLATE = """
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- macro call_json(call) -%}
{%- set arguments = call.function.arguments -%}
{"name": {{ call.function.name | tojson }}, "arguments": {% if arguments is string %}{{ arguments }}{% else %}{{ arguments | tojson }}{% endif %}}
{%- endmacro -%}
{%- if messages and messages[0].role in ['system', 'developer'] -%}
{%- set system = text(messages[0].content) -%}{%- set turns = messages[1:] -%}
{%- else -%}
{%- set system = default_system -%}{%- set turns = messages -%}
{%- endif -%}
<|im_start|>system
{{ system }}
{%- if tools -%}
{{ '\n\nYou can call tools. Their JSON schemas:\n<tools>' }}
{%- for tool in tools -%}
{{ '\n' }}{{ (tool.function if tool.function is defined else tool) | tojson }}
{%- endfor -%}
{{ '\n</tools>\nTo call a tool, reply with one line per call, exactly like this:\n' }}
{{- '<tool_call>{"name": "tool_name", "arguments": {"argument": "value"}}</tool_call>' }}
{%- endif %}<|im_end|>
{% for message in turns -%}
{%- if message.role == 'assistant' -%}
<|im_start|>assistant
{{ text(message.content) }}
{%- if message.tool_calls -%}
{%- for call in message.tool_calls -%}
{%- if not loop.first or text(message.content) %}
{% endif -%}
<tool_call>{{ call_json(call) }}</tool_call>
{%- endfor -%}
{%- endif -%}
<|im_end|>
{% elif message.role == 'tool' -%}
<|im_start|>user
<tool_response>
{{ text(message.content) }}
</tool_response><|im_end|>
{% else -%}
<|im_start|>{{ message.role }}
{{ text(message.content) }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
"""


ContentFormat = Literal["string", "openai"]
ToolSchemaFormat = Literal["default", "vllm_openai"]


@dataclass(frozen=True)
class ChatRendering:
    """How a base's conversations become prompt text: the endpoint renders rollouts with
    it and training tokenizes with it, so a trained turn reads as the model saw it.

    The fields are ART's `InternalModelConfig` keys, resolved: `template` (None: the
    tokenizer's own), `kwargs` (`chat_template_kwargs`: extra variables the template reads,
    e.g. `enable_thinking`), `content_format` (vLLM's `chat_template_content_format`, with
    "auto" already resolved) and `tool_schema_format` (`chat_template_tool_schema_format`).
    """

    template: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    content_format: ContentFormat = "string"
    tool_schema_format: ToolSchemaFormat = "default"


def chat_rendering(config: dev.InternalModelConfig, tokenizer: Any) -> ChatRendering:
    """The rendering `config` asks for on a base whose tokenizer is `tokenizer`."""
    template = _configured_template(config) or tool_template_for(tokenizer)
    content_format = config.chat_template_content_format
    if content_format == "auto":
        own = template if template is not None else getattr(tokenizer, "chat_template", None)
        content_format = _detected_content_format(own)
    return ChatRendering(
        template=template,
        kwargs=dict(config.chat_template_kwargs or {}),
        content_format=content_format,
        tool_schema_format=config.chat_template_tool_schema_format,
    )


def rendering_for(tokenizer: Any) -> ChatRendering:
    """The rendering a base with the default config gets."""
    return chat_rendering(dev.InternalModelConfig(), tokenizer)


def _configured_template(config: dev.InternalModelConfig) -> str | None:
    """ART's `chat_template` or `chat_template_path`, if either is given."""
    if config.chat_template_path is not None:
        return Path(config.chat_template_path).read_text(encoding="utf-8")
    return config.chat_template


def _detected_content_format(template: str | None) -> ContentFormat:
    """vLLM's "auto": "openai" (a list of parts) where the template loops over a message's
    content, else "string"."""
    if not isinstance(template, str):
        return "string"
    try:
        tree = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return "string"  # rendering names the error; detection need not
    for loop in tree.find_all(jinja2.nodes.For):
        for node in [loop.iter, *loop.iter.find_all(jinja2.nodes.Expr)]:
            if isinstance(node, jinja2.nodes.Getattr) and node.attr == "content":
                return "openai"
            if (
                isinstance(node, jinja2.nodes.Getitem)
                and isinstance(node.arg, jinja2.nodes.Const)
                and node.arg.value == "content"
            ):
                return "openai"
    return "string"


def tool_template_for(tokenizer: Any) -> str | None:
    """Our tool template where the tokenizer's own is ChatML without tools; else None."""
    own = getattr(tokenizer, "chat_template", None)
    if not isinstance(own, str) or "<|im_start|>" not in own:
        return None
    return None if "tools" in own else TOOL_CHATML_TEMPLATE


def render_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    rendering: ChatRendering,
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text for `messages` as `rendering` renders it; `kwargs` (a request's
    `chat_template_kwargs`) override the rendering's own. `continue_final_message`: the
    last message is left open (no end of turn after it), for the model to continue."""
    rendered = tokenizer.apply_chat_template(
        [_with_content_format(message, rendering.content_format) for message in messages],
        tools=[_tool_schema(tool, rendering.tool_schema_format) for tool in tools or []] or None,
        chat_template=rendering.template,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        tokenize=False,
        **{"default_system": DEFAULT_SYSTEM_PROMPT, **rendering.kwargs, **(kwargs or {})},
    )
    return str(rendered)


def _with_content_format(message: dict[str, Any], content_format: ContentFormat) -> dict[str, Any]:
    """`message` with its content as a string of its text parts, joined by newlines as vLLM
    joins them ("string"), or as a list of parts ("openai")."""
    content = message.get("content")
    if content_format == "string" and isinstance(content, list):
        text = "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
        return {**message, "content": text}
    if content_format == "openai" and isinstance(content, str):
        return {**message, "content": [{"type": "text", "text": content}]}
    return message


def _tool_schema(tool: dict[str, Any], tool_schema_format: ToolSchemaFormat) -> dict[str, Any]:
    """`tool` as given ("default"), or with its keys in the order vLLM's OpenAI server
    writes them ("vllm_openai": `type`, `function` first; then the function's `name`,
    `description`, `parameters`, `strict`), which a template printing the schema shows."""
    function = tool.get("function")
    if tool_schema_format == "default" or not isinstance(function, dict):
        return tool
    keys = ("name", "description", "parameters", "strict")
    ordered = {key: function[key] for key in keys if key in function}
    ordered.update({key: value for key, value in function.items() if key not in keys})
    rest = {key: value for key, value in tool.items() if key not in ("type", "function")}
    return {"type": tool.get("type", "function"), "function": ordered, **rest}


@dataclass(frozen=True)
class ParsedOutput:
    """Sampled text split into the visible content and OpenAI-shaped tool calls."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    call_ends: list[int] = field(default_factory=list)  # where each call's block ends in the text


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_DECODER = json.JSONDecoder()


def parse_tool_calls(text: str) -> ParsedOutput:
    """Find `<tool_call>{json}</tool_call>` blocks; any malformed block leaves the text as is.

    A block's JSON value is read whole, so `</tool_call>` inside one of its strings does
    not end it; after the value comes optional whitespace, then `</tool_call>` or the end
    of the text. A call is well formed when its JSON has a string `name` and object
    `arguments` (or a JSON string of an object). Text before the first call is kept as
    content; text between calls is dropped.
    """
    start = text.find(_OPEN)
    if start < 0:
        return ParsedOutput(text, [])
    calls: list[dict[str, Any]] = []
    ends: list[int] = []
    at = start
    while at >= 0:
        body = _skip_space(text, at + len(_OPEN))
        try:
            value, end = _DECODER.raw_decode(text, body)
        except json.JSONDecodeError:
            return ParsedOutput(text, [])
        end = _skip_space(text, end)
        if text.startswith(_CLOSE, end):
            end += len(_CLOSE)
        elif end < len(text):
            return ParsedOutput(text, [])
        call = _parse_call(value)
        if call is None:
            return ParsedOutput(text, [])
        calls.append(call)
        ends.append(end)
        at = text.find(_OPEN, end)
    content = text[:start].strip()
    return ParsedOutput(content or None, calls, ends)


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _parse_call(parsed: Any) -> dict[str, Any] | None:
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        return None
    arguments = parsed.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return tool_call(parsed["name"], arguments)


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI `tool_calls` entry calling `name` with `arguments`, with a fresh id."""
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
