"""`POST /v1/messages` (Anthropic's Messages API) through the anthropic SDK.

Most tests serve `build_app` over `FakeEngine` with uvicorn on 127.0.0.1, so each knows the
exact prompt and sampled ids it should get back: a conversation of Anthropic blocks must
reach the engine as the chat template's render of the equivalent chat messages. One test
asks the real default model through `shared_backend`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
import pytest_asyncio
from anthropic import Anthropic, AsyncAnthropic
from fake_endpoint import ScriptedRoute, Words, serving_app

import art
from art.core.data.exchanges import MessagesExchange, sampled_tokens, utc_now
from art.local import LocalBackend
from art.runtime.chat_format import render_prompt, rendering_for
from art.runtime.endpoint.messages import parse_messages_request
from art.runtime.endpoint.request import ChatCompletionRequest
from art.runtime.endpoint.server import build_app
from art.runtime.engines.base import Sample

VOCAB = Words([
    "<unk>", "<eos>", "user", "assistant", "system", "tool", ":", "hi", "there", "hello",
    "you", "again", "lookup", "be", "brief", "Paris", "Error:", "France",
])  # fmt: skip
# Renders roles, text (a string or text parts), the calls made with their arguments and
# the tools offered: enough for the prompt ids to differ wherever the conversation does.
TEMPLATE = (
    "{% for t in tools or [] %}{{ t['function']['name'] }} {% endfor %}"
    "{% for m in messages %}{{ m['role'] }} : "
    "{% if m['content'] is string %}{{ m['content'] }} "
    "{% else %}{% for p in m['content'] or [] %}{{ p['text'] }} {% endfor %}{% endif %}"
    "{% for c in m['tool_calls'] or [] %}{{ c['function']['name'] }} "
    "{{ c['function']['arguments'] }} {% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
CONTEXT = 64
KEY = "secret"
LOOKUP = {
    "name": "lookup",
    "description": "Looks a country's capital up.",
    "input_schema": {"type": "object", "properties": {"country": {"type": "string"}}},
}
LOOKUP_CHAT = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Looks a country's capital up.",
        "parameters": LOOKUP["input_schema"],
    },
}
CALL_TEXT = '<tool_call>{"name": "lookup", "arguments": {"country": "France"}}</tool_call>'


ids = VOCAB.ids


HELLO = Sample(token_ids=ids("hello", "there"), logprobs=[-0.25, -1.5], finish_reason="stop")
AGAIN = Sample(token_ids=ids("hi", "again", "you"), logprobs=[-0.5, -0.75, -2.0])  # length
CALL = Sample(token_ids=ids("lookup", "France"), logprobs=[-0.1, -0.2], text=CALL_TEXT)


class Served(ScriptedRoute):
    """A `build_app` over one FakeEngine route, named "base", served on 127.0.0.1."""

    def __init__(self) -> None:
        super().__init__(VOCAB.tokenizer(TEMPLATE), HELLO, CONTEXT)
        self.app = build_app(self, api_key=KEY)
        self.url = ""  # the server root: the SDK appends /v1/messages

    def client(self) -> Anthropic:
        return Anthropic(base_url=self.url, api_key=KEY, max_retries=0)

    def async_client(self) -> AsyncAnthropic:
        return AsyncAnthropic(base_url=self.url, api_key=KEY, max_retries=0)


@pytest.fixture
def served() -> Iterator[Served]:
    """The app served by uvicorn in a thread, on a free port of 127.0.0.1."""
    served = Served()
    with serving_app(served.app) as root:
        served.url = root
        yield served


HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}


def post(served: Served, body: dict[str, Any], headers: dict[str, str] = HEADERS) -> httpx.Response:
    return httpx.post(f"{served.url}/v1/messages", json=body, headers=headers, timeout=30)


def ask(**fields: Any) -> dict[str, Any]:
    return {"model": "base", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]} | (
        fields
    )


def extra(message: Any) -> dict[str, Any]:
    return dict(message.model_extra or {})


# --- answers ---------------------------------------------------------------------------------


def test_the_sdk_gets_a_message_with_the_token_ids(served: Served) -> None:
    raw = served.client().messages.with_raw_response.create(
        model="base",
        max_tokens=5,
        system="be brief",
        messages=[{"role": "user", "content": "hi there"}],
        metadata={"user_id": "u-1"},
        extra_body={"temperature": 0.5, "top_p": 0.9},
    )
    message = raw.parse()
    prompt = served.prompt(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    )
    assert prompt == ids("system", ":", "be", "brief", "user", ":", "hi", "there", "assistant", ":")
    assert message.id.startswith("msg_")
    assert (message.type, message.role, message.model) == ("message", "assistant", "base")
    (block,) = message.content
    assert block.type == "text"
    assert block.text == "hello there"
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (len(prompt), 2)
    assert extra(message) == {
        "prompt_token_ids": prompt,
        "token_ids": HELLO.token_ids,
        "token_logprobs": HELLO.logprobs,
        "policy_version": None,
    }
    (request,) = served.engine.requests
    assert request.prompt_ids == prompt
    params = request.params
    assert (params.max_tokens, params.temperature, params.top_p) == (5, 0.5, 0.9)
    assert served.releases == 1
    # read back as a captured exchange is, its tokens ready for training
    exchange = MessagesExchange(
        start_time=utc_now(), end_time=utc_now(), request={}, response=json.loads(raw.text())
    )
    (tokens,) = sampled_tokens(exchange)
    assert (tokens.prompt_token_ids, tokens.token_ids) == (prompt, HELLO.token_ids)


def test_text_blocks_and_combined_turns_render_as_one_turn(served: Served) -> None:
    served.client().messages.create(
        model="base",
        max_tokens=5,
        system=[{"type": "text", "text": "be"}, {"type": "text", "text": "brief"}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "user", "content": "there"},  # combined with the turn before, as Anthropic
            {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
            {"role": "user", "content": "again"},
        ],
    )
    assert served.engine.requests[0].prompt_ids == served.prompt(
        [
            {"role": "system", "content": [{"type": "text", "text": "be"}, {"type": "text", "text": "brief"}]},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": [{"type": "text", "text": "again"}]},
        ]
    )  # fmt: skip
    assert served.engine.requests[0].prompt_ids == ids(
        "system", ":", "be", "brief", "user", ":", "hi", "there", "assistant", ":", "hello",
        "user", ":", "again", "assistant", ":",
    )  # fmt: skip


def test_a_final_assistant_turn_is_continued_and_the_answer_holds_only_the_new_text(
    served: Served,
) -> None:
    served.script.samples = [AGAIN]
    message = served.client().messages.create(
        model="base",
        max_tokens=3,
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
        ],
    )
    # The turn is left open: no new "assistant :" after it, as a prefill reads.
    prompt = ids("user", ":", "hi", "assistant", ":", "hello")
    assert served.engine.requests[0].prompt_ids == prompt
    assert [block.text for block in message.content if block.type == "text"] == ["hi again you"]
    assert extra(message)["prompt_token_ids"] == prompt
    assert extra(message)["token_ids"] == AGAIN.token_ids


def test_running_out_of_tokens_is_max_tokens_and_a_stop_sequence_is_named(served: Served) -> None:
    client = served.client()
    served.script.samples = [AGAIN]
    assert client.messages.create(**ask()).stop_reason == "max_tokens"
    # The engine cuts the text before the stop string; the sampled ids hold it.
    stopped = Sample(ids("hello", "there", "you"), [-0.1, -0.2, -0.3], finish_reason="stop")
    stopped.text = "hello "
    served.script.samples = [stopped]
    stops = ["again", "there", "you", "hi", "lookup"]  # more than OpenAI's four
    message = client.messages.create(**ask(stop_sequences=stops))
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "there")
    assert message.content[0].type == "text"
    assert message.content[0].text == "hello "
    assert extra(message)["token_ids"] == stopped.token_ids
    assert served.engine.requests[-1].params.stop == tuple(stops)


async def test_a_stream_sends_anthropic_events_and_the_ids_on_message_delta(
    served: Served,
) -> None:
    client = served.async_client()
    async with client.messages.stream(**ask()) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_message()
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_stop"
    assert kinds.index("content_block_start") < kinds.index("content_block_stop")
    text = "".join(
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )  # fmt: skip
    assert text == "hello there"
    (delta,) = [event for event in events if event.type == "message_delta"]
    prompt = served.prompt([{"role": "user", "content": "hi"}])
    assert delta.delta.stop_reason == "end_turn"
    assert extra(delta) == {
        "prompt_token_ids": prompt,
        "token_ids": HELLO.token_ids,
        "token_logprobs": HELLO.logprobs,
        "policy_version": None,
    }
    assert final.content[0].type == "text"
    assert final.content[0].text == "hello there"
    assert (final.stop_reason, final.usage.input_tokens, final.usage.output_tokens) == (
        "end_turn",
        len(prompt),
        2,
    )
    assert served.releases == 1


async def test_a_stream_with_stop_sequences_sends_text_as_it_is_sampled(
    served: Served,
) -> None:
    """All but the tail a stop sequence could begin in goes out as sampled (the fake engine
    applies no stop sequence: the real one's cut is tests/backends/
    test_local_backend_serving.py's); the rest comes with the end."""
    client = served.async_client()
    async with client.messages.stream(**ask(stop_sequences=["zzz"])) as stream:
        events = [event async for event in stream]
    texts = [
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    ]  # fmt: skip
    assert len(texts) >= 2
    assert "".join(texts) == "hello there"
    assert served.engine.requests[-1].params.stop == ("zzz",)


def test_the_raw_stream_names_each_event(served: Served) -> None:
    with httpx.stream(
        "POST", f"{served.url}/v1/messages", json=ask(stream=True), headers=HEADERS
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in answer.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert names == [item["type"] for item in data]  # each event's name is its data's type
    assert names == [
        "message_start", "ping", "content_block_start", "content_block_delta",
        "content_block_delta", "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip


# --- tools -----------------------------------------------------------------------------------


def test_a_tool_use_turn_then_its_result(served: Served) -> None:
    client = served.client()
    served.script.samples = [CALL]
    first = client.messages.create(
        **ask(tools=[LOOKUP], messages=[{"role": "user", "content": "France"}])
    )
    assert first.stop_reason == "tool_use"
    (call,) = first.content
    assert call.type == "tool_use"
    assert call.id.startswith("toolu_")
    assert (call.name, call.input) == ("lookup", {"country": "France"})
    assert extra(first)["token_ids"] == CALL.token_ids
    assert served.engine.requests[0].prompt_ids == served.prompt(
        [{"role": "user", "content": "France"}], [LOOKUP_CHAT]
    )
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "Paris"}
    failed = {
        "type": "tool_result",
        "tool_use_id": call.id,
        "content": [{"type": "text", "text": "again"}],
        "is_error": True,
    }
    second = client.messages.create(
        **ask(
            tools=[LOOKUP],
            messages=[
                {"role": "user", "content": "France"},
                {"role": "assistant", "content": first.content},  # sent back as the SDK gave it
                {"role": "user", "content": [result, failed, {"type": "text", "text": "hi"}]},
            ],
        )
    )
    assert second.content[0].type == "text"
    assert second.content[0].text == "hello there"
    arguments = json.dumps({"country": "France"})
    chat: list[dict[str, Any]] = [
        {"role": "user", "content": "France"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": "lookup", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "Paris"},
        {"role": "tool", "tool_call_id": call.id, "content": "Error: again"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]  # fmt: skip
    prompt = served.engine.requests[1].prompt_ids
    assert prompt == served.prompt(chat, [LOOKUP_CHAT])
    tail = ids("tool", ":", "Paris", "tool", ":", "Error:", "again", "user", ":", "hi")
    assert prompt[-len(tail) - 2 : -2] == tail


async def test_a_streamed_tool_use_arrives_as_input_json(served: Served) -> None:
    served.script.samples = [CALL]
    async with served.async_client().messages.stream(**ask(tools=[LOOKUP])) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_message()
    (call,) = final.content
    assert call.type == "tool_use"
    assert call.input == {"country": "France"}
    assert final.stop_reason == "tool_use"
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    partial = [delta.partial_json for delta in deltas if delta.type == "input_json_delta"]
    assert json.loads("".join(partial)) == {"country": "France"}
    (delta,) = [event for event in events if event.type == "message_delta"]
    assert extra(delta)["token_ids"] == CALL.token_ids


def test_disabled_parallel_tool_use_keeps_the_first_call_and_its_tokens(served: Served) -> None:
    two = f"{CALL_TEXT}\n{CALL_TEXT.replace('France', 'Paris')}"
    # Words whose text runs as long as the calls', so the first call ends inside them.
    words = ids(*["France"] * (len(two) // 7 + 1))
    served.script.samples = [Sample(words, [-0.1] * len(words), text=two)]
    message = served.client().messages.create(
        **ask(tools=[LOOKUP], tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    )
    (call,) = message.content  # the second call is dropped, and so are its tokens
    assert call.type == "tool_use"
    assert call.input == {"country": "France"}
    kept = extra(message)["token_ids"]
    assert 0 < len(kept) < len(words)
    assert kept == words[: len(kept)]
    assert message.usage.output_tokens == len(kept)


def test_tool_choice_none_offers_no_tools(served: Served) -> None:
    served.script.samples = [Sample(ids("hi"), [-0.5], finish_reason="stop", text=CALL_TEXT)]
    message = served.client().messages.create(**ask(tools=[LOOKUP], tool_choice={"type": "none"}))
    request = served.engine.requests[-1]
    assert request.prompt_ids == served.prompt([{"role": "user", "content": "hi"}])  # no tools
    assert message.content[0].type == "text"
    assert message.stop_reason == "end_turn"


def test_tool_choice_and_output_format_become_their_chat_forms() -> None:
    # Grammars need a real tokenizer (llguidance reads its decoder), so the forced call and
    # the JSON schema are checked as the chat request they become; the chat path samples
    # under them (tests/runtime/test_structured_output.py).
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}

    def chat(**fields: Any) -> ChatCompletionRequest:
        _, request = parse_messages_request(json.dumps(ask(tools=[LOOKUP], **fields)).encode())
        return request

    forced = chat(tool_choice={"type": "tool", "name": "lookup", "disable_parallel_tool_use": True})
    assert forced.tool_choice == {"type": "function", "function": {"name": "lookup"}}
    assert forced.parallel_tool_calls is False
    assert forced.tools == [LOOKUP_CHAT]
    assert chat(tool_choice={"type": "any"}).tool_choice == "required"
    assert chat(tool_choice={"type": "auto"}).parallel_tool_calls is True
    formatted = chat(output_config={"format": {"type": "json_schema", "schema": schema}})
    assert formatted.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }


# --- refusals --------------------------------------------------------------------------------

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
CACHED = {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
WEB = {"type": "web_search_20250305", "name": "web_search"}


@pytest.mark.parametrize(
    ("body", "status", "kind", "named"),
    [
        ({"model": "base", "messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error", "max_tokens"),
        (ask(messages=[{"role": "user", "content": [IMAGE]}]), 400, "invalid_request_error", "messages[0].content[0]: image"),
        (ask(messages=[{"role": "user", "content": [CACHED]}]), 400, "invalid_request_error", "messages[0].content[0].cache_control"),
        (ask(top_k=5), 400, "invalid_request_error", "top_k"),
        (ask(thinking={"type": "enabled", "budget_tokens": 1024}), 400, "invalid_request_error", "thinking"),
        (ask(service_tier="auto"), 400, "invalid_request_error", "service_tier"),
        (ask(temperature=1.5), 400, "invalid_request_error", "temperature"),
        (ask(seed=3), 400, "invalid_request_error", "seed: unsupported parameter"),
        (ask(tools=[WEB]), 400, "invalid_request_error", "tools[0].type: server tools"),
        (ask(tools=[LOOKUP, LOOKUP]), 400, "invalid_request_error", "tools[1].name"),
        (ask(tool_choice={"type": "any"}), 400, "invalid_request_error", "tool_choice"),
        (ask(tools=[LOOKUP], tool_choice={"type": "tool", "name": "x"}), 400, "invalid_request_error", "tool_choice.name"),
        (ask(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}]}]), 400, "invalid_request_error", "messages[0].content[0].tool_use_id"),
        (ask(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello "}]), 400, "invalid_request_error", "messages[1].content: final assistant content cannot end with trailing whitespace"),
        (ask(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "lookup", "input": {}}]}], tools=[LOOKUP]), 400, "invalid_request_error", "messages[1].content[0]: the conversation ends with an assistant turn holding a tool_use"),
        (ask(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], tools=[LOOKUP], tool_choice={"type": "any"}), 400, "invalid_request_error", "tool_choice: a forced tool call"),
        (ask(messages=[{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]), 400, "invalid_request_error", "messages[0].content[0]: tool_result blocks do not belong"),
        (ask(messages=[]), 400, "invalid_request_error", "messages"),
        (ask(model="nobody"), 404, "not_found_error", "unknown model 'nobody'"),
    ],
)  # fmt: skip
def test_bad_requests_are_refused_in_anthropics_shape_naming_the_field(
    served: Served, body: dict[str, Any], status: int, kind: str, named: str
) -> None:
    answer = post(served, body)
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == kind
    assert error["error"]["message"].startswith(named), error["error"]["message"]
    assert served.engine.requests == []  # refused before anything was sampled
    # a request refused once its route was held lets the route go
    held = "forced tool call" in named  # found once routed
    assert served.releases == (1 if held else 0)


def test_a_max_tokens_past_the_context_is_cut_to_the_room_left(served: Served) -> None:
    answer = post(served, ask(max_tokens=10**12))
    assert answer.status_code == 200, answer.text
    prompt = len(served.engine.requests[0].prompt_ids)
    assert served.engine.requests[0].params.max_tokens == CONTEXT - prompt


def test_credentials_and_the_version_header_are_checked(served: Served) -> None:
    for headers in ({"anthropic-version": "2023-06-01"}, {**HEADERS, "x-api-key": "wrong"}):
        answer = post(served, ask(), headers)
        assert answer.status_code == 401
        assert answer.json()["error"]["type"] == "authentication_error"
    missing = post(served, ask(), {"x-api-key": KEY})
    assert missing.status_code == 400
    assert missing.json()["error"]["message"].startswith("anthropic-version: header is required")
    beta = post(served, ask(), {**HEADERS, "anthropic-beta": "prompt-caching-2024-07-31"})
    assert beta.status_code == 400
    assert beta.json()["error"]["message"].startswith("anthropic-beta: beta features")
    with pytest.raises(anthropic.AuthenticationError):
        Anthropic(base_url=served.url, api_key="wrong", max_retries=0).messages.create(**ask())
    with pytest.raises(anthropic.BadRequestError, match="top_k"):
        served.client().messages.create(**ask(), extra_body={"top_k": 3})
    assert served.engine.requests == []


# --- the real default model ------------------------------------------------------------------

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest_asyncio.fixture(loop_scope="session")
async def real_model(shared_backend: LocalBackend, unique_project: str) -> art.TrainableModel:
    model = art.TrainableModel(name="messages-agent", project=unique_project, base_model=BASE)
    await model.register(shared_backend)
    return model


async def test_the_default_model_answers_with_ids_of_its_text_and_prompt(
    real_model: art.TrainableModel,
) -> None:
    from transformers import AutoTokenizer

    from art.runtime import models

    root = str(real_model.inference_base_url).removesuffix("/").removesuffix("/v1")
    client = AsyncAnthropic(base_url=root, api_key=real_model.inference_api_key)
    message = await client.messages.create(
        model=real_model.get_inference_name(),
        max_tokens=8,
        system="Answer in one word.",
        messages=[{"role": "user", "content": "Name a colour."}],
    )
    tokenizer = AutoTokenizer.from_pretrained(models.resolve(BASE).weights)
    chat = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Name a colour."},
    ]
    text = render_prompt(tokenizer, chat, None, rendering_for(tokenizer))
    fields = extra(message)
    assert fields["prompt_token_ids"] == tokenizer(text, add_special_tokens=False).input_ids
    assert 1 <= len(fields["token_ids"]) <= 8
    assert len(fields["token_logprobs"]) == len(fields["token_ids"])
    assert all(logprob <= 0 for logprob in fields["token_logprobs"])
    decoded = tokenizer.decode(fields["token_ids"], skip_special_tokens=True)
    assert "".join(block.text for block in message.content if block.type == "text") == decoded
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.output_tokens == len(fields["token_ids"])
    assert fields["policy_version"] is None or isinstance(fields["policy_version"], int)
    # A prefill: the model's own template leaves the assistant turn open after its text.
    prefilled = await client.messages.create(
        model=real_model.get_inference_name(),
        max_tokens=4,
        messages=[
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "My answer:"},
        ],
    )
    prompt = extra(prefilled)["prompt_token_ids"]
    opened = render_prompt(tokenizer, chat[1:], None, rendering_for(tokenizer))
    assert prompt == tokenizer(opened + "My answer:", add_special_tokens=False).input_ids
    answer = "".join(block.text for block in prefilled.content if block.type == "text")
    sampled = tokenizer.decode(extra(prefilled)["token_ids"], skip_special_tokens=True)
    assert answer == sampled  # the answer is only what the model wrote after the prefill
