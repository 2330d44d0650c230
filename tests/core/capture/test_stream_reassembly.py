"""One re-assembler for the four protocols' streams: a streamed answer, put back together
by the capture pipeline (`build_exchange`), trains as the same answer asked for whole.

Each case asks our endpoint (over a `FakeEngine`, so both requests get the same sample)
once with `stream: false` and once with `stream: true`, and compares what training reads
of each exchange: the answers (message, tool calls, finish reason) and the sampled ids
and logprobs. Tool-call ids are minted per request, so they are left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fake_endpoint import ScriptedRoute, Words, serving_app

from art.core.capture.exchange_capture import build_exchange
from art.core.data.exchange_histories import answers
from art.core.data.exchanges import sampled_tokens, utc_now
from art.runtime.endpoint.server import build_app
from art.runtime.engines.base import Sample

VOCAB = Words(
    ["<unk>", "<eos>", "user", "assistant", ":", "hi", "hello", "there", "lookup", "France"]
)
TEMPLATE = (
    "{% for t in tools or [] %}{{ t['function']['name'] }} {% endfor %}"
    "{% for m in messages %}{{ m['role'] }} : "
    "{% if m['content'] is string %}{{ m['content'] }} "
    "{% else %}{% for p in m['content'] or [] %}{{ p['text'] }} {% endfor %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}assistant :{% endif %}"
)
KEY = "secret"
HEADERS = {"authorization": f"Bearer {KEY}", "x-api-key": KEY, "anthropic-version": "2023-06-01"}
ids = VOCAB.ids
CALL_TEXT = '<tool_call>{"name": "lookup", "arguments": {"country": "France"}}</tool_call>'
SAMPLES = {
    "text": Sample(token_ids=ids("hello", "there"), logprobs=[-0.25, -1.5], finish_reason="stop"),
    "cut": Sample(token_ids=ids("hi", "hello", "there"), logprobs=[-0.5, -0.75, -2.0]),
    "call": Sample(token_ids=ids("lookup", "France"), logprobs=[-0.1, -0.2], text=CALL_TEXT),
}
PARAMETERS = {"type": "object", "properties": {"country": {"type": "string"}}}
USER = [{"role": "user", "content": "hi"}]
# Each protocol's path and request; `tools` is added for the tool-call sample.
REQUESTS: dict[str, tuple[str, dict[str, Any], dict[str, Any] | None]] = {
    "chat_completions": (
        "/v1/chat/completions",
        {"model": "base", "max_tokens": 3, "messages": USER},
        {"tools": [{"type": "function", "function": {"name": "lookup", "parameters": PARAMETERS}}]},
    ),
    "completions": ("/v1/completions", {"model": "base", "max_tokens": 3, "prompt": "hi"}, None),
    "responses": (
        "/v1/responses",
        {"model": "base", "max_output_tokens": 3, "input": "hi"},
        {"tools": [{"type": "function", "name": "lookup", "parameters": PARAMETERS}]},
    ),
    "messages": (
        "/v1/messages",
        {"model": "base", "max_tokens": 3, "messages": USER},
        {"tools": [{"name": "lookup", "input_schema": PARAMETERS}]},
    ),
}
CASES = [
    pytest.param(protocol, sample, id=f"{protocol}-{sample}")
    for protocol, (_, _, tools) in REQUESTS.items()
    for sample in SAMPLES
    if sample != "call" or tools is not None
]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ScriptedRoute, str]]:
    route = ScriptedRoute(VOCAB.tokenizer(TEMPLATE), SAMPLES["text"], 64)
    with serving_app(build_app(route, api_key=KEY)) as root:
        yield route, root


def training_view(exchange: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    """What training reads of an exchange: its answers, tool-call ids left out, and the
    sampled ids and logprobs."""
    items = []
    for answer in answers(exchange):
        item = answer.item if isinstance(answer.item, dict) else answer.item.model_dump()
        for call in (item.get("message") or item).get("tool_calls") or []:
            call.pop("id", None)
        items.append(item)
    return items, list(sampled_tokens(exchange))


@pytest.mark.parametrize(("protocol", "sample"), CASES)
def test_a_streamed_answer_reassembles_to_the_whole_one(
    served: tuple[ScriptedRoute, str], protocol: str, sample: str
) -> None:
    route, root = served
    route.script.default = SAMPLES[sample]
    path, request, tools = REQUESTS[protocol]
    request = request | (tools if sample == "call" else {})
    views = []
    for stream in (False, True):
        asked = request | {"stream": stream}
        answer = httpx.post(root + path, json=asked, headers=HEADERS, timeout=30)
        assert answer.status_code == 200, answer.text
        streamed = answer.headers["content-type"].startswith("text/event-stream")
        assert streamed is stream
        exchange = build_exchange(
            protocol,
            asked,
            answer.content,
            start_time=utc_now(),
            end_time=utc_now(),  # type: ignore[arg-type]
        )
        views.append(training_view(exchange))
    whole, from_stream = views
    assert from_stream == whole
    items, tokens = whole
    assert [t.token_ids for t in tokens] == [SAMPLES[sample].token_ids]
    assert [t.token_logprobs for t in tokens] == [SAMPLES[sample].logprobs]
    if sample == "call" and protocol != "completions":
        calls = (items[0].get("message") or items[0])["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["lookup"]
