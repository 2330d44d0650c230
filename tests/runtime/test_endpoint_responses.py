"""`POST /v1/responses` (OpenAI's Responses API) through the openai SDK and openai-agents.

Most tests serve `build_app` over `FakeEngine` with uvicorn on 127.0.0.1, so each knows the
exact token ids it should get back; a tool-call follow-up must reach the engine as the
same prompt ids the equivalent chat completion request does. One test asks the real
default model through `shared_backend`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from fake_endpoint import ScriptedRoute, Words, serving_app
from openai import AsyncOpenAI, OpenAI
from openai.types.responses import Response

import art
from art.core.data.exchanges import ResponsesExchange, sampled_tokens
from art.local import LocalBackend
from art.runtime.chat_format import render_prompt, rendering_for
from art.runtime.endpoint.responses import (
    ResponseStore,
    StoredResponse,
    chat_request,
    parse_responses_request,
)
from art.runtime.endpoint.server import build_app
from art.runtime.engines.base import Sample
from art.runtime.engines.fake import FakeRequest

VOCAB = Words([
    "<unk>", "<eos>", "user", "assistant", "system", "tool", ":", "hi", "there", "hello",
    "you", "again", "lookup", "be", "brief",
])  # fmt: skip
# Renders roles, text, the names of calls made and of the tools offered: enough for the
# prompt ids to differ wherever the conversation does.
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} "
    "{% for c in m['tool_calls'] or [] %}{{ c['function']['name'] }} "
    "{{ c['function']['arguments'] }} {% endfor %}{% endfor %}"
    "{% for t in tools or [] %}{{ t['function']['name'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
CONTEXT = 64
CALL_TEXT = '<tool_call>{"name": "lookup", "arguments": {"q": "hi"}}</tool_call>'
LOOKUP = {
    "type": "function",
    "name": "lookup",
    "description": "Looks a word up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}


ids = VOCAB.ids


HELLO = Sample(token_ids=ids("hello", "there"), logprobs=[-0.25, -1.5], finish_reason="stop")
AGAIN = Sample(token_ids=ids("hi", "again", "you"), logprobs=[-0.5, -0.75, -2.0])  # length
CALL = Sample(token_ids=ids("lookup", "hi"), logprobs=[-0.1, -0.2], text=CALL_TEXT)


class Served(ScriptedRoute):
    """A `build_app` over one FakeEngine route, named "base", on 127.0.0.1."""

    def __init__(self) -> None:
        super().__init__(VOCAB.tokenizer(TEMPLATE), HELLO, CONTEXT)
        self.app = build_app(self, api_key="secret")
        self.url = ""

    def sync_client(self) -> OpenAI:
        return OpenAI(base_url=self.url, api_key="secret", max_retries=0)

    def async_client(self) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=self.url, api_key="secret", max_retries=0)


@pytest.fixture
def served() -> Iterator[Served]:
    """The app served by uvicorn in a thread, on a free port of 127.0.0.1."""
    served = Served()
    with serving_app(served.app) as root:
        served.url = f"{root}/v1"
        yield served


def post(served: Served, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": "Bearer secret"}
    return httpx.post(f"{served.url}/responses", json=body, headers=headers, timeout=30)


def extra(response: Any) -> dict[str, Any]:
    return dict(response.model_extra or {})


# --- answers ---------------------------------------------------------------------------------


def test_the_sync_sdk_gets_the_text_and_the_token_ids(served: Served) -> None:
    client = served.sync_client()
    raw = client.responses.with_raw_response.create(
        model="base", input="hi there", instructions="be brief", max_output_tokens=5
    )
    response = raw.parse()
    prompt = served.prompt(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    )
    assert response.status == "completed"
    assert response.output_text == "hello there"
    assert response.id.startswith("resp_")
    assert extra(response) == {
        "store": True,  # OpenAI's response has it; this SDK's type does not
        "prompt_token_ids": prompt,
        "token_ids": HELLO.token_ids,
        "token_logprobs": HELLO.logprobs,
        "policy_version": None,
    }
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (len(prompt), 2)
    assert response.usage.total_tokens == len(prompt) + 2
    assert (response.instructions, response.max_output_tokens) == ("be brief", 5)
    (message,) = response.output
    assert message.type == "message"
    assert message.status == "completed"
    (request,) = served.engine.requests
    assert request.prompt_ids == prompt
    assert request.params.max_tokens == 5
    assert served.releases == 1
    # strictly valid (as a captured exchange is read), and its tokens read back for training
    body = json.loads(raw.http_response.text)
    strict = Response.model_validate(body)
    now = datetime.now(UTC)
    exchange = ResponsesExchange(start_time=now, end_time=now, request={}, response=strict)
    (tokens,) = sampled_tokens(exchange)
    assert (tokens.prompt_token_ids, tokens.token_ids) == (prompt, HELLO.token_ids)


async def test_the_async_sdk_passes_sampling_and_echoes_the_request(served: Served) -> None:
    client = served.async_client()
    response = await client.responses.create(
        model="base",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        temperature=0.5,
        top_p=0.75,
        metadata={"run": "7"},
        user="someone",
        store=False,
    )
    assert response.output_text == "hello there"
    assert (response.temperature, response.top_p) == (0.5, 0.75)
    assert (response.metadata, response.user, response.store) == ({"run": "7"}, "someone", False)
    assert response.tool_choice == "auto"
    assert response.tools == []
    (request,) = served.engine.requests
    assert (request.params.temperature, request.params.top_p) == (0.5, 0.75)
    assert request.prompt_ids == served.prompt([{"role": "user", "content": "hi"}])
    assert extra(response)["token_ids"] == HELLO.token_ids


async def test_a_length_cut_answer_is_incomplete(served: Served) -> None:
    served.script.samples = [AGAIN]
    response = await served.async_client().responses.create(
        model="base", input="hi", max_output_tokens=3
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"
    assert response.output_text == "hi again you"
    assert extra(response)["token_logprobs"] == AGAIN.logprobs


def test_a_max_output_tokens_past_the_context_is_cut_to_the_room_left(served: Served) -> None:
    answer = post(served, {"model": "base", "input": "hi", "max_output_tokens": 10**12})
    assert answer.status_code == 200, answer.text
    (request,) = served.engine.requests
    assert request.params.max_tokens == CONTEXT - len(request.prompt_ids)


# --- streaming -------------------------------------------------------------------------------

TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


async def test_a_stream_sends_openais_events_and_the_final_response_has_the_ids(
    served: Served,
) -> None:
    client = served.async_client()
    async with client.responses.stream(model="base", input="hi there") as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    assert [event.type for event in events] == TEXT_EVENTS
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert deltas == ["hello", " there"]  # token by token, as decoded
    assert final.output_text == "hello there"
    assert final.status == "completed"
    assert extra(final)["token_ids"] == HELLO.token_ids
    assert extra(final)["prompt_token_ids"] == served.prompt(
        [{"role": "user", "content": "hi there"}]
    )
    assert served.releases == 1
    created = events[0]
    assert created.type == "response.created"
    assert created.response.id == final.id
    assert created.response.status == "in_progress"


def test_a_length_cut_stream_still_ends_with_response_completed(served: Served) -> None:
    served.script.samples = [AGAIN]
    with served.sync_client().responses.stream(model="base", input="hi") as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types[-1] == "response.completed"
    assert final.status == "incomplete"
    assert final.output_text == "hi again you"
    assert extra(final)["token_ids"] == AGAIN.token_ids


def test_create_with_stream_true_yields_the_raw_events(served: Served) -> None:
    events = list(served.sync_client().responses.create(model="base", input="hi", stream=True))
    assert [event.type for event in events] == TEXT_EVENTS
    last = events[-1]
    assert last.type == "response.completed"
    assert extra(last.response)["token_logprobs"] == HELLO.logprobs


# --- tool calls ------------------------------------------------------------------------------


def chat_equivalent(served: Served, messages: list[dict[str, Any]]) -> list[int]:
    """The prompt ids the engine saw for the same conversation sent to chat completions."""
    client = served.sync_client()
    tools = [
        {
            "type": "function",
            "function": {k: v for k, v in LOOKUP.items() if k != "type"},
        }
    ]
    client.chat.completions.create(model="base", messages=messages, tools=tools)  # type: ignore[arg-type]
    return served.engine.requests[-1].prompt_ids


def test_a_tool_call_then_its_output_by_previous_response_id_and_by_full_input(
    served: Served,
) -> None:
    served.script.samples = [CALL, HELLO, HELLO]
    client = served.sync_client()
    first = client.responses.create(model="base", input="hi", tools=[LOOKUP])  # type: ignore[list-item]
    (call,) = first.output
    assert call.type == "function_call"
    assert (call.name, json.loads(call.arguments)) == ("lookup", {"q": "hi"})
    assert call.call_id.startswith("call_")
    assert call.status == "completed"
    assert extra(first)["token_ids"] == CALL.token_ids
    assert first.tools[0].type == "function"
    assert first.tools[0].name == "lookup"
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "hello"}

    chained = client.responses.create(
        model="base",
        previous_response_id=first.id,
        input=[answer],
        tools=[LOOKUP],  # type: ignore[list-item]
    )
    by_id = served.engine.requests[-1].prompt_ids
    replayed = [{"role": "user", "content": "hi"}, call.model_dump(exclude_none=True), answer]
    client.responses.create(model="base", input=replayed, tools=[LOOKUP])  # type: ignore[arg-type, list-item]
    by_input = served.engine.requests[-1].prompt_ids

    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "lookup", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "hello"},
    ]
    assert by_id == by_input == chat_equivalent(served, messages)
    assert chained.output_text == "hello there"
    assert chained.previous_response_id == first.id
    assert extra(chained)["prompt_token_ids"] == by_id


def test_text_before_a_call_is_replayed_as_one_assistant_turn(served: Served) -> None:
    spoken = Sample(token_ids=ids("hi", "lookup"), logprobs=[-0.1, -0.2], text="hi " + CALL_TEXT)
    served.script.samples = [spoken, HELLO, HELLO]
    client = served.sync_client()
    first = client.responses.create(model="base", input="hi", tools=[LOOKUP])  # type: ignore[list-item]
    message, call = first.output
    assert message.type == "message"
    assert first.output_text == "hi"
    assert call.type == "function_call"
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "hello"}
    replayed = [
        {"role": "user", "content": "hi"},
        *(item.model_dump(exclude_none=True) for item in first.output),
        answer,
    ]
    client.responses.create(model="base", input=replayed, tools=[LOOKUP])  # type: ignore[arg-type, list-item]
    tool_call = {
        "id": call.call_id,
        "type": "function",
        "function": {"name": "lookup", "arguments": call.arguments},
    }
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hi", "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "hello"},
    ]
    by_input = served.engine.requests[-1].prompt_ids
    assert by_input == chat_equivalent(served, messages)


async def test_a_streamed_tool_call_sends_its_arguments_events(served: Served) -> None:
    served.script.samples = [CALL]
    client = served.async_client()
    async with client.responses.stream(model="base", input="hi", tools=[LOOKUP]) as stream:  # type: ignore[list-item]
        events = [event async for event in stream]
        final = await stream.get_final_response()
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    (call,) = final.output
    assert call.type == "function_call"
    assert json.loads(call.arguments) == {"q": "hi"}
    assert extra(final)["token_ids"] == CALL.token_ids
    # the streamed response was stored: a follow-up may name it
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "hello"}
    followed = await client.responses.create(
        model="base",
        previous_response_id=final.id,
        input=[answer],
        tools=[LOOKUP],  # type: ignore[list-item]
    )
    assert followed.output_text == "hello there"


def test_tool_choice_and_text_format_become_their_chat_forms() -> None:
    # Grammars need a real tokenizer (llguidance reads its decoder), so the forced call and
    # the JSON schema are checked as the chat request they become; the chat path samples
    # under them (tests/runtime/test_structured_output.py).
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    body = parse_responses_request(
        json.dumps(
            {
                "model": "base",
                "input": "hi",
                "tools": [LOOKUP],
                "tool_choice": {"type": "function", "name": "lookup"},
                "parallel_tool_calls": False,
                "text": {"format": {"type": "json_schema", "name": "q", "schema": schema}},
            }
        ).encode()
    )
    chat, items = chat_request(body, None)
    assert chat.tool_choice == {"type": "function", "function": {"name": "lookup"}}
    assert chat.tools == [
        {"type": "function", "function": {k: v for k, v in LOOKUP.items() if k != "type"}}
    ]
    assert chat.parallel_tool_calls is False
    assert chat.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "q", "schema": schema, "strict": False},
    }
    assert items == [{"type": "message", "role": "user", "content": "hi"}]


async def test_an_openai_agents_run_calls_the_tool_and_answers(served: Served) -> None:
    from agents import Agent, Runner, function_tool
    from agents.models.openai_responses import OpenAIResponsesModel

    looked_up: list[str] = []

    @function_tool
    def lookup(q: str) -> str:
        """Looks a word up."""
        looked_up.append(q)
        return "hello"

    served.script.samples = [CALL, HELLO]
    model = OpenAIResponsesModel(model="base", openai_client=served.async_client())
    agent = Agent(name="looker", instructions="be brief", tools=[lookup], model=model)
    result = await Runner.run(agent, "hi")
    assert result.final_output == "hello there"
    assert looked_up == ["hi"]
    first, second = served.engine.requests
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"q": "hi"}'},
    }
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "hello"},
    ]
    tools = [{"type": "function", "function": {"name": "lookup"}}]  # the template shows names
    assert first.prompt_ids == served.prompt(messages[:2], tools)
    assert second.prompt_ids == served.prompt(messages, tools)


# --- storage -------------------------------------------------------------------------------


async def test_a_stored_response_is_retrieved_and_an_unstored_one_is_not(served: Served) -> None:
    client = served.async_client()
    stored = await client.responses.create(model="base", input="hi")
    again = await client.responses.retrieve(stored.id)
    assert again.model_dump() == stored.model_dump()
    assert extra(again)["token_ids"] == HELLO.token_ids
    unstored = await client.responses.create(model="base", input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="base", input="hi", previous_response_id=unstored.id)
    assert refused.value.param == "previous_response_id"  # type: ignore[attr-defined]


def test_the_store_keeps_the_most_recently_used() -> None:
    store = ResponseStore(capacity=2)
    for name in "abc":
        if name == "c":
            assert store.get("a") is not None  # a is used: b is now the oldest
        store.put(name, StoredResponse({"id": name}, []))
    assert [store.get(name) is not None for name in "abc"] == [True, False, True]


# --- refusals ------------------------------------------------------------------------------

BAD: list[tuple[dict[str, Any], int, str]] = [
    ({"model": "nobody", "input": "hi"}, 404, "model"),
    ({"input": "hi", "color": "red"}, 400, "color"),
    ({"input": "hi", "reasoning": {"effort": "high"}}, 400, "reasoning"),
    ({"input": "hi", "include": ["reasoning.encrypted_content"]}, 400, "include"),
    ({"input": "hi", "background": True}, 400, "background"),
    ({"input": "hi", "truncation": "auto"}, 400, "truncation"),
    ({"input": "hi", "temperature": 3}, 400, "temperature"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    ({"input": "hi", "tool_choice": "required"}, 400, "tool_choice"),
    ({"input": "hi", "tools": [LOOKUP], "tool_choice": {"type": "function", "name": "x"}}, 400,
     "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, 400,
     "text.format.schema"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "input[0].type"),
    ({"input": [{"role": "robot", "content": "hi"}]}, 400, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400,
     "input[0].content[0].type"),
    ({"input": [{"type": "function_call_output", "call_id": "c1", "output": "x"}]}, 400,
     "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{"}]}, 400,
     "input[0].arguments"),
    ({"input": "hi", "previous_response_id": "resp_nothing"}, 400, "previous_response_id"),
    ({"input": []}, 400, "input"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "status", "param"), BAD, ids=[p for _, _, p in BAD])
def test_a_bad_request_is_refused_naming_the_parameter(
    served: Served, fields: dict[str, Any], status: int, param: str
) -> None:
    answer = post(served, {"model": "base", **fields})
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert param.split("[")[0] in error["message"]
    assert served.engine.requests == []
    assert served.releases in (0, 1)  # released if the route was taken
    assert post(served, {"model": "base", "input": "hi"}).status_code == 200  # serving goes on


def test_defaults_the_sdks_send_are_accepted(served: Served) -> None:
    answer = post(
        served,
        {
            "model": "base",
            "input": "hi",
            "include": [],
            "background": False,
            "truncation": "disabled",
            "service_tier": "auto",
            "reasoning": None,
            "parallel_tool_calls": True,
            "text": {"format": {"type": "text"}},
            "tools": [],
        },
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["text"] == {"format": {"type": "text"}}


def test_the_sdk_raises_the_error_with_its_param(served: Served) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        served.sync_client().responses.create(
            model="base", input="hi", reasoning={"effort": "high"}
        )
    assert refused.value.param == "reasoning"  # type: ignore[attr-defined]


async def test_the_route_is_released_once_however_the_request_ends(served: Served) -> None:
    client = served.async_client()
    async with client.responses.stream(model="base", input="hi") as stream:
        await stream.get_final_response()
    await client.responses.create(model="base", input="hi")
    with pytest.raises(openai.BadRequestError):  # refused after the route was taken
        await client.responses.create(model="base", input="hi " * CONTEXT)  # fills the context
    # A stream ends two ways (its last event, then the response's background task): had
    # either released the route again, the two requests after it would have seen it.
    assert served.releases == 3


async def test_a_generation_that_fails_mid_stream_ends_with_response_failed(
    served: Served,
) -> None:
    def broken(request: FakeRequest) -> list[Sample]:
        raise RuntimeError("the engine broke")

    served.engine.script = broken
    client = served.async_client()
    async with client.responses.stream(model="base", input="hi") as stream:
        events = [event async for event in stream]
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            await stream.get_final_response()
    assert [event.type for event in events][-2:] == ["error", "response.failed"]
    failed = events[-1]
    assert failed.type == "response.failed"
    assert failed.response.error is not None
    assert "the engine broke" in failed.response.error.message
    assert served.releases == 1


# --- the real default model --------------------------------------------------------------

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest_asyncio.fixture(loop_scope="session")
async def real_model(shared_backend: LocalBackend, unique_project: str) -> art.TrainableModel:
    model = art.TrainableModel(name="responses-agent", project=unique_project, base_model=BASE)
    await model.register(shared_backend)
    return model


async def test_the_default_model_answers_with_ids_of_its_text_and_prompt(
    real_model: art.TrainableModel,
) -> None:
    from transformers import AutoTokenizer

    from art.runtime import models

    client = AsyncOpenAI(
        base_url=real_model.inference_base_url, api_key=real_model.inference_api_key
    )
    response = await client.responses.create(
        model=real_model.get_inference_name(),
        instructions="Answer in one word.",
        input="Name a colour.",
        max_output_tokens=8,
    )
    tokenizer = AutoTokenizer.from_pretrained(models.resolve(BASE).weights)
    messages = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Name a colour."},
    ]
    text = render_prompt(tokenizer, messages, None, rendering_for(tokenizer))
    fields = extra(response)
    assert fields["prompt_token_ids"] == tokenizer(text, add_special_tokens=False).input_ids
    assert 1 <= len(fields["token_ids"]) <= 8
    assert len(fields["token_logprobs"]) == len(fields["token_ids"])
    assert all(logprob <= 0 for logprob in fields["token_logprobs"])
    decoded = tokenizer.decode(fields["token_ids"], skip_special_tokens=True)
    assert response.output_text == decoded
    assert response.status in ("completed", "incomplete")
    assert fields["policy_version"] is None or isinstance(fields["policy_version"], int)
