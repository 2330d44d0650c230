"""Tool calls whose JSON arguments hold `</tool_call>` in a string stay tool calls.

A LangGraph agent with one tool and `tool_choice="required"` once sampled schema-valid
arguments holding the closing tag inside a JSON string; a parser that cut the call at
the first `</tool_call>` returned the whole message as text. The call ends where its
JSON value ends. Checked on the parser, and through the endpoint's own response builder
on the real default-model tokenizer, for a forced call (the prefilled path) and a free one.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from art.runtime.chat_format import parse_tool_calls
from art.runtime.endpoint.request import ChatCompletionRequest
from art.runtime.endpoint.response import Job, Route, choice
from art.runtime.engines.base import Sample, SamplingParams

NOTE = {"text": "close it with </tool_call> then <tool_call>{} done"}
ARGUMENTS = json.dumps(NOTE)
CALL = '<tool_call>{"name": "write_note", "arguments": ' + ARGUMENTS + "}</tool_call>"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        },
    }
    for name in ("write_note", "read_note")
]


def test_a_closing_tag_inside_a_json_string_does_not_end_the_call() -> None:
    parsed = parse_tool_calls(
        "Writing it.\n" + CALL + '\n<tool_call>{"name": "read_note", '
        '"arguments": {"text": "</tool_call>"}} </tool_call>'
    )
    assert parsed.content == "Writing it."
    assert [call["function"]["name"] for call in parsed.tool_calls] == ["write_note", "read_note"]
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == NOTE
    assert json.loads(parsed.tool_calls[1]["function"]["arguments"]) == {"text": "</tool_call>"}
    text = "Writing it.\n" + CALL
    assert parsed.call_ends[0] == len(text)


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "write_note", "arguments": {}} trailing</tool_call>',
        '<tool_call>{"name": "write_note", "arguments": {"text": "</tool_call>"</tool_call>',
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
        "<tool_call>not json</tool_call>",
    ],
)
def test_a_malformed_call_leaves_the_text_as_is(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert (parsed.content, parsed.tool_calls) == (text, [])


def test_an_unclosed_call_at_the_end_of_the_text_is_a_call() -> None:
    parsed = parse_tool_calls(CALL.removesuffix("</tool_call>") + "\n")
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == NOTE


@pytest.fixture(scope="module")
def tokenizer(default_model: tuple[Any, Any]) -> Any:
    return default_model[1]


def message_for(tokenizer: Any, prefill: str, forced: str | None, sampled: str) -> dict[str, Any]:
    """The message the endpoint returns when the engine sampled `sampled` after `prefill`."""
    ids = list(tokenizer(sampled, add_special_tokens=False)["input_ids"])
    sample = Sample(
        token_ids=ids,
        logprobs=[-0.5] * len(ids),
        finish_reason="stop",
        text=tokenizer.decode(ids, skip_special_tokens=True),
    )
    body = ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "Note how to close a tool call."}],
        tools=TOOLS if forced is None else TOOLS[:1],
        tool_choice="required",
        logprobs=True,
    )
    job = Job(
        prompt_ids=[1, 2, 3],
        params=SamplingParams(max_tokens=64),
        prefill=prefill,
        forced_tool=forced,
        tool_names=("write_note",) if forced else ("write_note", "read_note"),
    )
    # The engine is not used to build a choice; the tokenizer is the model's own.
    route = Route(None, tokenizer, None, None, 2048)  # type: ignore[arg-type]
    answer = choice(body, route, job, 0, sample)
    assert answer["token_ids"] == ids
    return dict(answer["message"]) | {"finish_reason": answer["finish_reason"]}


def test_a_forced_call_with_the_tag_in_its_arguments_is_a_tool_call(tokenizer: Any) -> None:
    # One tool and `required`: the endpoint prefills up to the arguments (as `_prepare` does)
    # and the grammar makes the model write them, then `}</tool_call>`.
    prefill = '<tool_call>{"name": "write_note", "arguments": '
    message = message_for(tokenizer, prefill, "write_note", ARGUMENTS + "}</tool_call>")
    assert message["finish_reason"] == "tool_calls"
    assert message["content"] is None
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "write_note"
    assert json.loads(call["function"]["arguments"]) == NOTE


def test_a_required_call_among_tools_with_the_tag_in_its_arguments(tokenizer: Any) -> None:
    # Several tools and `required`: only `<tool_call>` is prefilled.
    message = message_for(tokenizer, "<tool_call>", None, CALL.removeprefix("<tool_call>"))
    assert message["finish_reason"] == "tool_calls"
    (call,) = message["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == NOTE
