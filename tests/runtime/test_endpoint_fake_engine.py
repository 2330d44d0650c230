"""The endpoint over `FakeEngine`: routing and the answer's shape, with no model loaded.

The tokenizer is a word-level one built here from a dozen words, with a one-line chat
template; the engine answers from a script. So each test runs in milliseconds and knows
the exact ids and logprobs it should get back.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fake_endpoint import FixedRoutes, Words, fake_route

from art.runtime.endpoint.response import Route
from art.runtime.endpoint.server import build_app
from art.runtime.engines.base import EngineUnavailable, Sample, SamplingParams
from art.runtime.engines.fake import FakeEngine, FakeRequest

VOCAB = Words(["<unk>", "<eos>", "user", "assistant", ":", "hi", "there", "hello", "you", "again"])
ids = VOCAB.ids
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
CONTEXT = 64


def tiny_tokenizer() -> Any:
    return VOCAB.tokenizer(TEMPLATE)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return tiny_tokenizer()


HELLO = Sample(token_ids=ids("hello", "there"), logprobs=[-0.25, -1.5], finish_reason="stop")
AGAIN = Sample(token_ids=ids("hi", "again", "you"), logprobs=[-0.5, -0.75, -2.0])


@pytest.fixture
def engine(tokenizer: Any) -> FakeEngine:
    return FakeEngine(tokenizer, [HELLO, AGAIN])


def route(engine: FakeEngine, adapter: str | None = None, step: int | None = None) -> Route:
    return fake_route(engine, CONTEXT, adapter, step)


@pytest_asyncio.fixture
async def http(engine: FakeEngine) -> AsyncIterator[httpx.AsyncClient]:
    routes = {"base": route(engine), "proj/agent@3": route(engine, "agent-3", step=3)}
    router = FixedRoutes(routes, CONTEXT)
    transport = httpx.ASGITransport(app=build_app(router, api_key=None))
    async with httpx.AsyncClient(transport=transport, base_url="http://fake/v1") as client:
        yield client


def ask(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi there"}], **fields}


async def test_a_chat_completion_returns_the_scripted_ids_and_logprobs(
    http: httpx.AsyncClient, engine: FakeEngine, tokenizer: Any
) -> None:
    answer = await http.post("/chat/completions", json=ask("base", logprobs=True, max_tokens=5))
    assert answer.status_code == 200, answer.text
    (choice,) = answer.json()["choices"]
    prompt = ids("user", ":", "hi", "there", "assistant", ":")
    assert choice["prompt_token_ids"] == prompt
    assert choice["token_ids"] == HELLO.token_ids
    assert choice["token_logprobs"] == HELLO.logprobs
    assert [item["logprob"] for item in choice["logprobs"]["content"]] == HELLO.logprobs
    assert [item["token"] for item in choice["logprobs"]["content"]] == ["hello", "there"]
    assert choice["message"] == {"role": "assistant", "content": "hello there"}
    assert choice["finish_reason"] == "stop"
    assert choice["policy_version"] is None
    assert answer.json()["usage"] == {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}
    (request,) = engine.requests
    assert request.prompt_ids == prompt
    assert (request.adapter, request.n) == (None, 1)
    assert request.params.max_tokens == 5


async def test_a_max_tokens_past_the_context_is_cut_to_the_room_left(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    for field in ("max_tokens", "max_completion_tokens"):
        engine.requests.clear()
        answer = await http.post("/chat/completions", json=ask("base", **{field: 2**63}))
        assert answer.status_code == 200, answer.text
        (request,) = engine.requests
        assert request.params.max_tokens == CONTEXT - len(request.prompt_ids)


async def test_an_unknown_model_is_a_404_naming_it(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    answer = await http.post("/chat/completions", json=ask("nobody"))
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["message"] == "unknown model 'nobody'; this endpoint serves base, proj/agent@3"
    assert (error["param"], error["code"]) == ("model", "model_not_found")
    assert engine.requests == []  # refused before the engine was asked


async def test_n_choices_each_carry_their_own_sample(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    answer = await http.post("/chat/completions", json=ask("base", n=3))
    assert answer.status_code == 200, answer.text
    choices = answer.json()["choices"]
    assert [choice["index"] for choice in choices] == [0, 1, 2]
    assert [choice["token_ids"] for choice in choices] == [
        HELLO.token_ids,
        AGAIN.token_ids,
        HELLO.token_ids,
    ]
    assert [choice["token_logprobs"] for choice in choices][1] == AGAIN.logprobs
    assert choices[1]["message"]["content"] == "hi again you"
    assert choices[1]["finish_reason"] == "length"
    assert answer.json()["usage"]["completion_tokens"] == 7
    assert [request.n for request in engine.requests] == [3]


async def test_a_stream_sends_the_text_then_each_choice_with_its_ids(
    http: httpx.AsyncClient,
) -> None:
    async with http.stream("POST", "/chat/completions", json=ask("base", stream=True)) as answer:
        assert answer.status_code == 200
        lines = [line async for line in answer.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    deltas = [chunk["choices"][0]["delta"].get("content", "") for chunk in chunks]
    assert "".join(deltas) == "hello there"
    final = chunks[-1]["choices"][0]
    assert (final["token_ids"], final["token_logprobs"]) == (HELLO.token_ids, HELLO.logprobs)
    assert final["finish_reason"] == "stop"


async def test_a_checkpoint_route_samples_with_its_adapter_and_says_its_step(
    http: httpx.AsyncClient, engine: FakeEngine, tmp_path: Any
) -> None:
    gone = await http.post("/chat/completions", json=ask("proj/agent@3"))
    assert gone.status_code == 404  # its adapter is not loaded in the engine
    assert "'agent-3'" in gone.json()["error"]["message"]
    engine.load_adapter("agent-3", tmp_path)
    answer = await http.post("/chat/completions", json=ask("proj/agent@3"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["policy_version"] == 3
    assert [request.adapter for request in engine.requests] == ["agent-3"]


async def test_a_scripted_function_sees_each_request(tokenizer: Any) -> None:
    def echo(request: FakeRequest) -> list[Sample]:
        last = request.prompt_ids[-3:]
        return [Sample(token_ids=last, logprobs=[-1.0] * len(last))] * request.n

    engine = FakeEngine(tokenizer, echo)
    samples = await engine.generate(ids("hi", "you", "again"), SamplingParams(max_tokens=4), n=2)
    assert [sample.token_ids for sample in samples] == [ids("hi", "you", "again")] * 2
    assert samples[0].text == "hi you again"
    assert samples[0].token_ids is not samples[1].token_ids  # each its own, as engines give
    engine.close()
    with pytest.raises(EngineUnavailable, match="closed"):
        await engine.generate([1], SamplingParams(max_tokens=4))


async def test_the_last_assistant_message_is_continued_when_asked(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    hello = {"role": "assistant", "content": "hello"}
    prefilled = ask("base", add_generation_prompt=False, continue_final_message=True)
    prefilled["messages"].append(hello)
    answer = await http.post("/chat/completions", json=prefilled)
    assert answer.status_code == 200, answer.text
    (choice,) = answer.json()["choices"]
    # The prompt ends inside the assistant's turn; the answer is only what was sampled.
    assert choice["prompt_token_ids"] == ids("user", ":", "hi", "there", "assistant", ":", "hello")
    assert choice["message"]["content"] == "hello there"
    answer = await http.post("/chat/completions", json=ask("base", add_generation_prompt=False))
    assert answer.json()["choices"][0]["prompt_token_ids"] == ids("user", ":", "hi", "there")
    assert [request.prompt_ids for request in engine.requests] == [
        ids("user", ":", "hi", "there", "assistant", ":", "hello"),
        ids("user", ":", "hi", "there"),
    ]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"continue_final_message": True}, "is true with add_generation_prompt"),
        (
            {"continue_final_message": True, "add_generation_prompt": False},
            "is true but the last message is the user's",
        ),
    ],
)
async def test_a_continuation_that_cannot_be_is_a_400_naming_it(
    http: httpx.AsyncClient, engine: FakeEngine, fields: dict[str, Any], says: str
) -> None:
    answer = await http.post("/chat/completions", json=ask("base", **fields))
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "continue_final_message"
    assert says in error["message"]
    assert engine.requests == []


async def test_with_a_key_the_v1_routes_need_it_in_either_header_and_health_does_not(
    engine: FakeEngine,
) -> None:
    app = build_app(FixedRoutes({"base": route(engine)}, CONTEXT), api_key="sesame")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
            answer = await client.post("/v1/chat/completions", json=ask("base"), headers=headers)
            assert answer.status_code == 401, headers
            assert answer.json()["error"]["code"] == "invalid_api_key"
        assert engine.requests == []  # refused before the body was read
        assert (await client.get("/v1/models")).status_code == 401
        for headers in ({"authorization": "Bearer sesame"}, {"x-api-key": "sesame"}):
            answer = await client.post("/v1/chat/completions", json=ask("base"), headers=headers)
            assert answer.status_code == 200, answer.text
        assert (await client.get("/health")).json() == {"status": "ok"}
