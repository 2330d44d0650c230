"""`POST /v1/completions` (OpenAI's legacy Completions API) through the openai SDK and raw HTTP.

Most tests serve the endpoint over `FakeEngine` with a word-level tokenizer built here, so
the ids, logprobs and index order they check are exactly known; one samples the real
default model through the shared backend.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
import requests
from fake_endpoint import FixedRoutes, Words, fake_route, serving_app
from openai import AsyncOpenAI, BadRequestError, OpenAI

import art
from art.local import LocalBackend
from art.runtime.endpoint.response import Route
from art.runtime.endpoint.server import build_app
from art.runtime.engines.base import Sample
from art.runtime.engines.fake import FakeEngine, FakeRequest

VOCAB = Words(["<unk>", "<eos>", "once", "upon", "a", "time", "there", "was", "cat", "dog", "end"])
ids = VOCAB.ids
CONTEXT = 32
CAT = Sample(token_ids=ids("a", "cat"), logprobs=[-0.5, -1.0], finish_reason="stop")
DOG = Sample(token_ids=ids("a", "dog", "end"), logprobs=[-0.25, -0.5, -0.25])  # length


class Routes(FixedRoutes):
    """The base model and a checkpoint of it, counting each route's releases."""

    def __init__(self, engine: FakeEngine) -> None:
        self.released: list[str] = []
        super().__init__({"base": self.to(engine, "base")}, CONTEXT)
        self.routes["proj/agent@2"] = self.to(engine, "proj/agent@2", "agent-2", 2)

    def to(
        self, engine: FakeEngine, name: str, adapter: str | None = None, step: int | None = None
    ) -> Route:
        """A route named `name` to `engine`, noting its releases."""
        return fake_route(engine, CONTEXT, adapter, step, lambda: self.released.append(name))


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return VOCAB.tokenizer()


@pytest.fixture
def engine(tokenizer: Any) -> FakeEngine:
    return FakeEngine(tokenizer, [CAT, DOG])


@pytest.fixture
def routes(engine: FakeEngine) -> Routes:
    return Routes(engine)


@pytest.fixture
def server(routes: Routes) -> Iterator[str]:
    """The app served by uvicorn on 127.0.0.1 in a thread; its /v1 URL."""
    with serving_app(build_app(routes, api_key="secret")) as root:
        yield f"{root}/v1"


@pytest_asyncio.fixture
async def client(routes: Routes) -> AsyncIterator[AsyncOpenAI]:
    """`AsyncOpenAI` talking to the app through httpx's ASGI transport."""
    transport = httpx.ASGITransport(app=build_app(routes, api_key="secret"))
    async with httpx.AsyncClient(transport=transport) as http:
        yield AsyncOpenAI(base_url="http://fake/v1", api_key="secret", http_client=http)


def extra(holder: Any) -> dict[str, Any]:
    return dict(holder.model_extra or {})


def test_the_sync_sdk_gets_a_completion_with_its_token_ids(
    server: str, engine: FakeEngine, routes: Routes
) -> None:
    sdk = OpenAI(base_url=server, api_key="secret")
    completion = sdk.completions.create(model="base", prompt="once upon a time", max_tokens=5)
    assert completion.object == "text_completion"
    assert completion.id.startswith("cmpl-")
    (choice,) = completion.choices
    assert (choice.text, choice.index, choice.finish_reason) == ("a cat", 0, "stop")
    assert choice.logprobs is None
    assert extra(choice) == {
        "prompt_token_ids": ids("once", "upon", "a", "time"),
        "token_ids": CAT.token_ids,
        "token_logprobs": CAT.logprobs,
        "policy_version": None,
    }
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (4, 2)
    assert completion.usage.total_tokens == 6
    (request,) = engine.requests
    assert request.prompt_ids == ids("once", "upon", "a", "time")  # no chat template
    assert (request.params.max_tokens, request.n, request.adapter) == (5, 1, None)
    assert routes.released == ["base"]


async def test_a_batch_of_prompts_times_n_is_in_openais_index_order(
    client: AsyncOpenAI, engine: FakeEngine
) -> None:
    completion = await client.completions.create(
        model="base", prompt=["once upon", "there was a"], n=2, seed=3, temperature=0.5
    )
    choices = completion.choices
    assert [choice.index for choice in choices] == [0, 1, 2, 3]
    assert [extra(choice)["prompt_token_ids"] for choice in choices] == [
        ids("once", "upon"),
        ids("once", "upon"),
        ids("there", "was", "a"),
        ids("there", "was", "a"),
    ]
    # Each prompt is one engine request of n rows; row j of prompt p is choice p * n + j.
    assert [choice.text for choice in choices] == ["a cat", "a dog end"] * 2
    assert [choice.finish_reason for choice in choices] == ["stop", "length"] * 2
    assert [(r.prompt_ids, r.n) for r in engine.requests] == [
        (ids("once", "upon"), 2),
        (ids("there", "was", "a"), 2),
    ]
    params = engine.requests[0].params
    assert (params.seed, params.temperature, params.max_tokens) == (3, 0.5, 16)
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 5  # each prompt once, not once per sample
    assert completion.usage.completion_tokens == 10


async def test_a_checkpoint_route_says_its_policy_version(
    client: AsyncOpenAI, engine: FakeEngine, tmp_path: Any
) -> None:
    engine.load_adapter("agent-2", tmp_path)
    completion = await client.completions.create(model="proj/agent@2", prompt=[[2, 3]])
    assert extra(completion.choices[0])["policy_version"] == 2
    assert [request.adapter for request in engine.requests] == ["agent-2"]


async def test_the_sdk_streams_text_then_each_choice_with_ids_then_usage(
    client: AsyncOpenAI, routes: Routes
) -> None:
    stream = await client.completions.create(
        model="base",
        prompt="once upon",
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert all(chunk.object == "text_completion" for chunk in chunks)
    texts = ["", ""]
    finals: dict[int, Any] = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.text
        if choice.finish_reason is not None:
            finals[choice.index] = choice
    assert texts == ["a cat", "a dog end"]
    assert len(chunks) > 3  # the text came in pieces, before the final chunks
    assert [finals[i].finish_reason for i in (0, 1)] == ["stop", "length"]
    assert extra(finals[1])["token_ids"] == DOG.token_ids
    assert extra(finals[1])["token_logprobs"] == DOG.logprobs
    assert extra(finals[0])["prompt_token_ids"] == ids("once", "upon")
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (2, 5)
    assert routes.released == ["base"]  # once, though a stream may end two ways


async def test_legacy_logprobs_hold_tokens_offsets_and_the_top_k_with_the_sampled_one(
    tokenizer: Any, routes: Routes
) -> None:
    sample = Sample(
        token_ids=ids("a", "cat"),
        logprobs=[-0.5, -2.0],
        top_logprobs=[[(4, -0.5), (8, -1.0)], [(9, -0.1), (10, -1.5)]],  # "cat" not in top 2
        finish_reason="stop",
    )
    routes.routes["base"] = routes.to(FakeEngine(tokenizer, [sample]), "base")
    transport = httpx.ASGITransport(app=build_app(routes, api_key=None))
    async with httpx.AsyncClient(transport=transport) as http:
        sdk = AsyncOpenAI(base_url="http://fake/v1", api_key="x", http_client=http)
        completion = await sdk.completions.create(model="base", prompt="once", logprobs=1)
        stream = await sdk.completions.create(model="base", prompt="once", logprobs=2, stream=True)
        chunks = [chunk async for chunk in stream]
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens == ["a", "cat"]
    assert logprobs.token_logprobs == [-0.5, -2.0]
    # Each token starts where the text before it ends (a BPE token holds its own space).
    assert logprobs.text_offset == [0, 1]
    assert logprobs.top_logprobs == [{"a": -0.5}, {"dog": -0.1, "cat": -2.0}]
    # Streamed with logprobs, the text comes whole with its logprobs in the last chunk.
    (last,) = chunks
    (choice,) = last.choices
    assert (choice.text, choice.finish_reason) == ("a cat", "stop")
    assert choice.logprobs is not None
    assert choice.logprobs.top_logprobs == [
        {"a": -0.5, "cat": -1.0},
        {"dog": -0.1, "end": -1.5, "cat": -2.0},
    ]


def test_raw_json_gets_openais_defaults_and_token_id_names(server: str, engine: FakeEngine) -> None:
    answer = requests.post(
        f"{server}/completions",
        headers={"Authorization": "Bearer secret"},
        json={
            "model": "base",
            "prompt": [2, 3],
            "temperature": None,  # null: the default
            "logprobs": 0,
            "stop": ["end"],
            "return_tokens_as_token_ids": True,
            "user": "someone",
        },
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["object"] == "text_completion"
    choice = data["choices"][0]
    assert set(choice) == {
        "text",
        "index",
        "logprobs",
        "finish_reason",
        "prompt_token_ids",
        "token_ids",
        "token_logprobs",
        "policy_version",
    }
    assert choice["logprobs"]["tokens"] == ["token_id:4", "token_id:8"]
    assert choice["logprobs"]["top_logprobs"] == [{"token_id:4": -0.5}, {"token_id:8": -1.0}]
    (request,) = engine.requests
    params = request.params
    assert (params.max_tokens, params.temperature, params.stop) == (16, 1.0, ("end",))
    assert params.top_logprobs == 0


async def test_best_of_returns_the_n_samples_of_highest_mean_logprob(
    client: AsyncOpenAI, engine: FakeEngine
) -> None:
    # Rows: CAT (mean -0.75), DOG (mean -1/3), CAT.
    completion = await client.completions.create(model="base", prompt="once", best_of=3)
    (choice,) = completion.choices
    assert extra(choice)["token_ids"] == DOG.token_ids
    assert engine.requests[0].n == 3
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 7  # every sampled sequence


async def test_echo_puts_the_prompt_before_the_completion(client: AsyncOpenAI) -> None:
    completion = await client.completions.create(model="base", prompt="once upon", echo=True)
    assert completion.choices[0].text == "once upon" + "a cat"
    stream = await client.completions.create(model="base", prompt=[2, 3], echo=True, stream=True)
    text = "".join([chunk.choices[0].text async for chunk in stream])
    assert text == "once upon" + "a cat"


async def test_max_tokens_unset_is_cut_to_the_room_left_in_the_context(
    client: AsyncOpenAI, engine: FakeEngine
) -> None:
    prompt = " ".join(["cat"] * (CONTEXT - 3))
    await client.completions.create(model="base", prompt=prompt)
    assert engine.requests[0].params.max_tokens == 3


async def test_max_tokens_past_the_context_is_cut_to_the_room_left_as_vllm_does(
    client: AsyncOpenAI, engine: FakeEngine
) -> None:
    prompt = " ".join(["cat"] * (CONTEXT - 3))
    for asked in (CONTEXT, 2**63):
        engine.requests.clear()
        await client.completions.create(model="base", prompt=prompt, max_tokens=asked)
        assert engine.requests[0].params.max_tokens == 3


BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"prompt": None}, "prompt", "Field required"),
    ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"max_tokens": "many"}, "max_tokens", "valid integer"),
    ({"prompt": ""}, "prompt", "no tokens"),
    ({"prompt": []}, "prompt", "must be a string"),
    ({"prompt": ["once", 3]}, "prompt[1]", "does not match prompt[0]"),
    ({"prompt": [[2], []]}, "prompt[1]", "non-empty list of token ids"),
    ({"prompt": [2, 99]}, "prompt", "token id 99 is not in this model's vocabulary"),
    ({"prompt": ["once", "cat " * CONTEXT]}, "prompt[1]", "the model's context is 32"),
    ({"suffix": " end"}, "suffix", "not supported"),
    ({"logit_bias": {"8": 5}}, "logit_bias", "not supported"),
    ({"presence_penalty": 0.5}, "presence_penalty", "not supported"),
    ({"frequency_penalty": -1}, "frequency_penalty", "not supported"),
    ({"best_of": 1, "n": 2}, "best_of", "less than n"),
    ({"best_of": 2, "stream": True}, "best_of", "cannot be streamed"),
    ({"echo": True, "logprobs": 1}, "echo", "prompt's logprobs"),
    ({"logprobs": 6}, "logprobs", "less than or equal to 5"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "only with stream"),
    ({"stream": True, "stream_options": {"x": 1}}, "stream_options.x", "unsupported"),
    ({"stop": ["a", ""]}, "stop", "non-empty"),
    ({"temperature": 3}, "temperature", "less than or equal to 2"),
    ({"prompt": ["once"] * 513, "n": 2}, "prompt", "split the batch"),
    ({"tools": []}, "tools", "unsupported parameter"),
]


@pytest.mark.parametrize(("fields", "param", "words"), BAD, ids=[b[1] for b in BAD])
def test_bad_input_is_a_400_naming_the_parameter(
    server: str, engine: FakeEngine, routes: Routes, fields: dict[str, Any], param: str, words: str
) -> None:
    body = {"model": "base", "prompt": "once", **fields}
    answer = requests.post(
        f"{server}/completions", headers={"Authorization": "Bearer secret"}, json=body, timeout=30
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert words in error["message"]
    assert engine.requests == []
    assert routes.released in ([], ["base"])  # refused before routing, or released


async def test_the_sdk_raises_a_refusal_naming_the_parameter(client: AsyncOpenAI) -> None:
    with pytest.raises(BadRequestError) as refused:
        await client.completions.create(model="base", prompt="once", suffix="end")
    assert refused.value.param == "suffix"
    assert refused.value.status_code == 400


async def test_an_unknown_model_is_a_404_naming_it(routes: Routes) -> None:
    transport = httpx.ASGITransport(app=build_app(routes, api_key=None))
    async with httpx.AsyncClient(transport=transport, base_url="http://fake/v1") as http:
        answer = await http.post("/completions", json={"model": "nobody", "prompt": "once"})
        not_json = await http.post("/completions", content=b"{")
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == ("model", "model_not_found")
    assert "unknown model 'nobody'" in error["message"]
    assert not_json.status_code == 400
    assert not_json.json()["error"]["param"] == "body"


async def test_a_server_writing_token_ids_writes_them_unless_a_request_says_otherwise(
    routes: Routes,
) -> None:
    # `art run` serves with tokens_as_ids, as ART's vLLM server does, for every protocol.
    transport = httpx.ASGITransport(app=build_app(routes, api_key=None, tokens_as_ids=True))
    async with httpx.AsyncClient(transport=transport, base_url="http://fake/v1") as http:
        asked = {"model": "base", "prompt": [2, 3], "logprobs": 0}
        default = await http.post("/completions", json=asked)
        text = await http.post("/completions", json=asked | {"return_tokens_as_token_ids": False})
    assert default.json()["choices"][0]["logprobs"]["tokens"] == ["token_id:4", "token_id:8"]
    assert text.json()["choices"][0]["logprobs"]["tokens"] == ["a", "cat"]


async def test_a_failed_generation_releases_the_route_once(tokenizer: Any, routes: Routes) -> None:
    def broken(request: FakeRequest) -> list[Sample]:
        raise RuntimeError("the engine broke")

    routes.routes["base"] = routes.to(FakeEngine(tokenizer, broken), "base")
    transport = httpx.ASGITransport(app=build_app(routes, api_key=None), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://fake/v1") as http:
        whole = await http.post("/completions", json={"model": "base", "prompt": ["once", "a"]})
        streamed = await http.post(
            "/completions", json={"model": "base", "prompt": "once", "stream": True}
        )
    assert whole.status_code == 500
    assert streamed.status_code == 200  # headers were sent: the failure is in the stream
    events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert json.loads(events[-1].removeprefix("data: "))["error"]["type"] == "server_error"
    assert routes.released == ["base", "base"]  # once per request


BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


async def test_the_default_model_completes_a_prompt_with_its_exact_token_ids(
    shared_backend: LocalBackend, unique_project: str
) -> None:
    from transformers import AutoTokenizer

    from art.runtime.models import default_model_dir

    model = art.TrainableModel(name="completer", project=unique_project, base_model=BASE)
    await model.register(shared_backend)
    assert model.inference_base_url is not None
    sdk = AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key)
    prompt = "The capital of France is"
    completion = await sdk.completions.create(
        model=model.get_inference_name(), prompt=prompt, max_tokens=8, logprobs=2, temperature=0
    )
    (choice,) = completion.choices
    fields = extra(choice)
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    assert fields["prompt_token_ids"] == tokenizer(prompt).input_ids
    assert 1 <= len(fields["token_ids"]) <= 8
    assert len(fields["token_logprobs"]) == len(fields["token_ids"])
    assert all(logprob <= 0 for logprob in fields["token_logprobs"])
    assert tokenizer.decode(fields["token_ids"], skip_special_tokens=True) == choice.text
    assert choice.finish_reason in ("stop", "length")
    assert choice.logprobs is not None
    assert choice.logprobs.token_logprobs == fields["token_logprobs"]
    assert fields["policy_version"] == 0  # a model just registered serves step 0

    # Streamed, the text arrives as the engine's thread samples it, then the ids.
    stream = await sdk.completions.create(
        model=model.get_inference_name(), prompt=prompt, max_tokens=4, stream=True
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(chunk.choices[0].text for chunk in chunks)
    final = extra(chunks[-1].choices[0])
    assert final["prompt_token_ids"] == tokenizer(prompt).input_ids
    assert tokenizer.decode(final["token_ids"], skip_special_tokens=True) == text
