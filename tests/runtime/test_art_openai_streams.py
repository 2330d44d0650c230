"""`art.openai` (ART's helpers) reads the endpoint's stream into the completion a call
without `stream=True` returns, token ids and logprobs included, through the `openai` SDK.

The endpoint runs over `FakeEngine` (tests/runtime/test_endpoint_fake_engine.py), so the
ids and logprobs each answer must carry are known.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from fake_endpoint import FixedRoutes
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from test_endpoint_fake_engine import AGAIN, CONTEXT, HELLO, route, tiny_tokenizer

from art.openai import (
    IncompleteChatCompletionStreamError,
    consume_chat_completion_stream,
    consume_sync_chat_completion_stream,
)
from art.runtime.endpoint.server import build_app
from art.runtime.engines.fake import FakeEngine

MESSAGES: Any = [{"role": "user", "content": "hi there"}]


@pytest.fixture
def app() -> Any:
    return build_app(
        FixedRoutes({"base": route(FakeEngine(tiny_tokenizer(), [HELLO, AGAIN]))}, CONTEXT),
        api_key=None,
    )


@pytest_asyncio.fixture
async def client(app: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport) as http:
        yield openai.AsyncOpenAI(base_url="http://fake/v1", api_key="-", http_client=http)  # type: ignore[arg-type]


def assert_the_same_answer(streamed: ChatCompletion, whole: ChatCompletion) -> None:
    assert [c.message for c in streamed.choices] == [c.message for c in whole.choices]
    assert [c.finish_reason for c in streamed.choices] == [c.finish_reason for c in whole.choices]
    for ours, theirs in zip(streamed.choices, whole.choices, strict=True):
        assert ours.logprobs == theirs.logprobs
        for key in ("token_ids", "token_logprobs", "prompt_token_ids"):
            assert (ours.model_extra or {})[key] == (theirs.model_extra or {})[key], key


async def test_a_stream_reads_back_as_the_whole_answer_ids_and_logprobs_included(
    client: openai.AsyncOpenAI,
) -> None:
    asks: Any = {"model": "base", "messages": MESSAGES, "logprobs": True, "n": 2}
    whole = await client.chat.completions.create(**asks)
    seen: list[str] = []
    stream = await client.chat.completions.create(
        **asks, stream=True, stream_options={"include_usage": True}
    )
    streamed = await consume_chat_completion_stream(
        stream, lambda chunk, so_far: seen.append(so_far.choices[0].message.content or "")
    )
    assert_the_same_answer(streamed, whole)
    assert [c.message.content for c in streamed.choices] == ["hello there", "hi again you"]
    assert seen[-1] == "hello there"
    assert len(seen) > 1  # called with each chunk, as it grew
    assert streamed.usage is not None
    assert streamed.usage.completion_tokens == 5


async def test_stop_iteration_in_on_chunk_ends_the_read_early(client: openai.AsyncOpenAI) -> None:
    calls: list[ChatCompletionChunk] = []

    def first_chunk_only(chunk: ChatCompletionChunk, so_far: ChatCompletion) -> None:
        calls.append(chunk)
        raise StopIteration

    stream = await client.chat.completions.create(model="base", messages=MESSAGES, stream=True)
    early = await consume_chat_completion_stream(stream, first_chunk_only)
    assert len(calls) == 1
    assert calls[0].choices[0].finish_reason is None  # its choice unfinished, yet returned
    assert (early.choices[0].message.content or "") == (calls[0].choices[0].delta.content or "")


async def test_a_stream_without_usage_is_refused_where_usage_is_required(
    client: openai.AsyncOpenAI,
) -> None:
    stream = await client.chat.completions.create(model="base", messages=MESSAGES, stream=True)
    with pytest.raises(IncompleteChatCompletionStreamError, match="include_usage"):
        await consume_chat_completion_stream(stream, require_usage=True)


def test_the_sync_client_reads_its_stream_the_same_way(app: Any) -> None:
    with httpx.Client(transport=_SyncASGI(app)) as http:
        client = openai.OpenAI(base_url="http://fake/v1", api_key="-", http_client=http)  # type: ignore[arg-type]
        stream = client.chat.completions.create(model="base", messages=MESSAGES, stream=True)
        streamed = consume_sync_chat_completion_stream(stream)
    assert streamed.choices[0].message.content == "hello there"
    assert (streamed.choices[0].model_extra or {})["token_ids"] == HELLO.token_ids


class _SyncASGI(httpx.BaseTransport):
    """httpx has no synchronous ASGI transport: each request runs the app on a loop."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        import asyncio

        async def call() -> httpx.Response:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app)) as http:
                response = await http.send(
                    httpx.Request(
                        request.method, request.url, headers=request.headers, content=request.read()
                    )
                )
                return httpx.Response(
                    response.status_code, headers=response.headers, content=response.content
                )

        return asyncio.run(call())
