"""ART 0.5.23's capture: model calls made inside `with art.Trajectory() as t:` land in
`t.exchanges`, through each HTTP library's own hook (nothing is patched).

Chat completions go to our endpoint over `FakeEngine` (served by uvicorn on 127.0.0.1),
so each exchange must carry the exact scripted token ids. Completions, Responses and
Messages are answered by a stub server of hand-written bodies, JSON and SSE, in the shapes
OpenAI and Anthropic document with our four extension fields added, and read by the real
openai and anthropic SDKs; the stub also serves the broken and cut-short answers.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import aiohttp
import anthropic
import httpx
import openai
import pytest
from fake_endpoint import FixedRoutes, Words, fake_route, serving_app
from helpers import serving

import art
from art.core.data.exchanges import SampledTokens, sampled_tokens
from art.runtime.endpoint.server import build_app
from art.runtime.engines.base import Sample
from art.runtime.engines.fake import FakeEngine, FakeRequest

# --- our endpoint over FakeEngine --------------------------------------------------------

VOCAB = Words(["<unk>", "<eos>", "user", "assistant", ":", "hi", "there", "hello", "you", "again"])
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)


ids = VOCAB.ids


HELLO = Sample(token_ids=ids("hello", "there"), logprobs=[-0.25, -1.5], finish_reason="stop")
PROMPT = ids("user", ":", "hi", "there", "assistant", ":")  # "hi there", rendered
ASK = [{"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """Our endpoint over FakeEngine (every request answered "hello there"); its /v1 URL."""
    tokenizer = VOCAB.tokenizer(TEMPLATE)

    def answer(request: FakeRequest) -> list[Sample]:
        return [HELLO] * request.n

    route = fake_route(FakeEngine(tokenizer, answer), 64)
    with serving_app(build_app(FixedRoutes({"base": route}, 64), api_key=None)) as root:
        yield f"{root}/v1"


def _ours(exchange: Any) -> SampledTokens:
    (tokens,) = sampled_tokens(exchange)
    return tokens


def _assert_hello(trajectory: art.Trajectory, streams: list[bool]) -> None:
    """`trajectory` holds one chat exchange per call made, each sampled "hello there"."""
    exchanges = trajectory.exchanges.chat_completions
    assert [exchange.request.get("stream", False) for exchange in exchanges] == streams
    for exchange in exchanges:
        assert exchange.request["messages"] == ASK
        assert exchange.response.choices[0].message.content == "hello there"
        tokens = _ours(exchange)
        assert (tokens.prompt_token_ids, tokens.token_ids) == (PROMPT, HELLO.token_ids)
        assert tokens.token_logprobs == HELLO.logprobs
        assert exchange.start_time <= exchange.end_time
    assert not trajectory.logs


# --- chat completions, through each client hook -----------------------------------------


async def test_async_openai_records_a_call_and_a_stream_with_their_token_ids(
    endpoint: str,
) -> None:
    client = openai.AsyncOpenAI(
        base_url=endpoint, api_key="x", http_client=art.capture_http_client(), max_retries=0
    )
    with art.Trajectory() as t:
        plain = await client.chat.completions.create(model="base", messages=ASK)  # type: ignore[arg-type]
        stream = await client.chat.completions.create(
            model="base",
            messages=ASK,  # type: ignore[arg-type]
            stream=True,
        )
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    assert (plain.choices[0].message.content, text) == ("hello there", "hello there")
    _assert_hello(t, [False, True])
    assert t.exchanges.chat_completions[0].response.id == plain.id
    assert "duration" in t.metrics  # the scope's exit finished it
    await client.close()


def test_sync_openai_records_through_the_sync_client(endpoint: str) -> None:
    client = openai.OpenAI(
        base_url=endpoint, api_key="x", http_client=art.capture_sync_http_client(), max_retries=0
    )
    with art.Trajectory() as t:
        client.chat.completions.create(model="base", messages=ASK)  # type: ignore[arg-type]
        for _ in client.chat.completions.create(model="base", messages=ASK, stream=True):  # type: ignore[arg-type]
            pass
    _assert_hello(t, [False, True])
    client.close()


async def test_an_aiohttp_session_with_the_trace_config_records(endpoint: str) -> None:
    body = {"model": "base", "messages": ASK}
    async with aiohttp.ClientSession(trace_configs=[art.capture_trace_config()]) as session:
        with art.Trajectory() as t:
            async with session.post(f"{endpoint}/chat/completions", json=body) as answer:
                assert (await answer.json())["choices"][0]["message"]["content"] == "hello there"
            streamed = {**body, "stream": True}
            async with session.post(f"{endpoint}/chat/completions", json=streamed) as answer:
                lines = [line async for line in answer.content]
        assert lines[-2].strip() == b"data: [DONE]"
        async with session.post(f"{endpoint}/chat/completions", json=body) as answer:
            await answer.read()  # outside every scope: recorded nowhere
    _assert_hello(t, [False, True])


def test_a_requests_session_records(endpoint: str) -> None:
    session = art.capture_requests_session()
    body = {"model": "base", "messages": ASK}
    with art.Trajectory() as t:
        answer = session.post(f"{endpoint}/chat/completions", json=body)
        assert answer.json()["choices"][0]["message"]["content"] == "hello there"
        with session.post(
            f"{endpoint}/chat/completions", json={**body, "stream": True}, stream=True
        ) as streamed:
            lines = [line for line in streamed.iter_lines() if line]
    assert lines[-1] == b"data: [DONE]"
    _assert_hello(t, [False, True])
    session.close()


def test_a_client_without_a_hook_and_other_requests_are_not_recorded(endpoint: str) -> None:
    with art.Trajectory() as t, art.capture_sync_http_client() as c:
        httpx.post(f"{endpoint}/chat/completions", json={"model": "base", "messages": ASK})
        assert c.get(f"{endpoint}/models").status_code == 200  # a GET: not a model call
        refused = c.post(f"{endpoint}/chat/completions", json={"model": "nobody", "messages": ASK})
        assert refused.status_code == 404  # not 2xx: nothing was sampled
    assert not t.exchanges
    assert not t.logs


# --- scopes ------------------------------------------------------------------------------


async def test_nested_scopes_record_into_the_innermost_and_no_capture_hides_them(
    endpoint: str,
) -> None:
    client = openai.AsyncOpenAI(
        base_url=endpoint, api_key="x", http_client=art.capture_http_client(), max_retries=0
    )

    async def ask() -> None:
        await client.chat.completions.create(model="base", messages=ASK)  # type: ignore[arg-type]

    with art.Trajectory() as outer:
        await ask()
        with art.Trajectory() as inner:
            await ask()
            await ask()
        with art.no_capture():
            await ask()
            with art.Trajectory() as hidden_then_open:
                await ask()
    assert [len(t.exchanges.chat_completions) for t in (outer, inner, hidden_then_open)] == [
        1,
        2,
        1,
    ]
    await client.close()


async def test_concurrent_tasks_and_threads_keep_their_own_exchanges(endpoint: str) -> None:
    async_client = openai.AsyncOpenAI(
        base_url=endpoint, api_key="x", http_client=art.capture_http_client(), max_retries=0
    )
    sync_client = openai.OpenAI(
        base_url=endpoint, api_key="x", http_client=art.capture_sync_http_client(), max_retries=0
    )

    async def rollout(calls: int) -> art.Trajectory:
        with art.Trajectory() as t:
            for _ in range(calls):
                await async_client.chat.completions.create(model="base", messages=ASK)  # type: ignore[arg-type]
                # a sync client in a worker thread (a copied context) records here too
                await asyncio.to_thread(
                    sync_client.chat.completions.create,
                    model="base",
                    messages=ASK,  # type: ignore[arg-type]
                )
        return t

    trajectories = await asyncio.gather(*(rollout(calls) for calls in (1, 2, 3)))
    assert [len(t.exchanges.chat_completions) for t in trajectories] == [2, 4, 6]
    await async_client.close()
    sync_client.close()


async def test_art_trajectory_and_trajectory_group_capture_each_rollout(endpoint: str) -> None:
    client = openai.AsyncOpenAI(
        base_url=endpoint, api_key="x", http_client=art.capture_http_client(), max_retries=0
    )

    async def rollout(calls: int) -> None:
        for _ in range(calls):
            await client.chat.completions.create(model="base", messages=ASK)  # type: ignore[arg-type]
        art.current_trajectory(require=True).reward = calls

    with art.Trajectory() as outer:
        group = await art.trajectory_group(art.trajectory(rollout(n)) for n in (3, 1, 2))
    assert [t.reward for t in group.trajectories] == [3, 1, 2]  # the order given
    assert [len(t.exchanges.chat_completions) for t in group] == [3, 1, 2]
    assert not outer.exchanges  # each rollout captured into its own scope only
    await client.close()


# --- another server ----------------------------------------------------------------------


async def test_a_call_to_another_server_is_an_exchange_without_token_ids(
    chat_server_url: str,
) -> None:
    client = openai.AsyncOpenAI(
        base_url=chat_server_url, api_key="x", http_client=art.capture_http_client()
    )
    with art.Trajectory() as t:
        answer = await client.chat.completions.create(
            model="judge",
            messages=[{"role": "user", "content": "rate it"}],
        )
    (exchange,) = t.exchanges.chat_completions
    assert exchange.model == "judge"
    assert exchange.response.choices[0].message.content == answer.choices[0].message.content
    assert list(sampled_tokens(exchange)) == []  # context, never trained
    await client.close()


# --- the other three protocols, from hand-written bodies ---------------------------------

EXTENSION = {
    "prompt_token_ids": [11, 12, 13],
    "token_ids": [21, 22],
    "token_logprobs": [-0.5, -0.25],
    "policy_version": 4,
}
OURS = SampledTokens([11, 12, 13], [21, 22], [-0.5, -0.25], 4)
RELEASE = threading.Event()  # lets the stub finish a stream it holds open


def _sse(*events: tuple[str | None, Any]) -> bytes:
    out = b""
    for name, data in events:
        if name is not None:
            out += f"event: {name}\n".encode()
        text = data if isinstance(data, str) else json.dumps(data)
        out += f"data: {text}\n\n".encode()
    return out


def _completion(stream: bool) -> bytes:
    top = {"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "base"}
    if not stream:
        choice = {"index": 0, "text": "hello there", "finish_reason": "length", "logprobs": None}
        return json.dumps({**top, "choices": [{**choice, **EXTENSION}]}).encode()
    first = {"index": 0, "text": "hello", "finish_reason": None, "logprobs": None}
    first |= {"prompt_token_ids": [11, 12, 13], "token_ids": [21], "token_logprobs": [-0.5]}
    last = {"index": 0, "text": " there", "finish_reason": "length", "logprobs": None}
    last |= {"token_ids": [22], "token_logprobs": [-0.25], "policy_version": 4}
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    return _sse(
        (None, {**top, "choices": [first]}),
        (None, {**top, "choices": [last]}),
        (None, {**top, "choices": [], "usage": usage}),
        (None, "[DONE]"),
    )


RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "created_at": 7,
    "model": "base",
    "status": "completed",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "hello there", "annotations": []}],
        }
    ],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "error": None,
    "incomplete_details": None,
    "instructions": None,
    "metadata": {},
    **EXTENSION,
}


def _response(stream: bool) -> bytes:
    if not stream:
        return json.dumps(RESPONSE).encode()
    created = {**RESPONSE, "status": "in_progress", "output": []}
    for key in EXTENSION:
        created.pop(key)
    delta = {"item_id": "msg_1", "output_index": 0, "content_index": 0, "sequence_number": 2}
    return _sse(
        ("response.created", {"type": "response.created", "response": created}),
        ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "hello"}),
        ("response.output_text.delta", {**delta, "type": "response.output_text.delta"}),
        ("response.completed", {"type": "response.completed", "response": RESPONSE}),
    )


MESSAGE_START = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "base",
    "content": [],
    "stop_reason": None,
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 1},
}


def _message(stream: bool) -> bytes:
    if not stream:
        content = [
            {"type": "text", "text": "hello there"},
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"city": "Paris"}},
        ]
        body = {**MESSAGE_START, "content": content, "stop_reason": "tool_use", **EXTENSION}
        body["usage"] = {"input_tokens": 3, "output_tokens": 2}
        return json.dumps(body).encode()
    tool = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}
    return _sse(
        ("message_start", {"type": "message_start", "message": MESSAGE_START}),
        ("ping", {"type": "ping"}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "hello"},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": " there"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": tool}),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"city": '},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '"Paris"}'},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 2},
                **EXTENSION,
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    )


class _Stub(BaseHTTPRequestHandler):
    """Hand-written answers by path; chat models "garbled" and "held" misbehave."""

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        stream = request.get("stream") is True
        if self.path.endswith("/chat/completions"):
            if request["model"] == "held":
                self._held()
            else:
                self._send(b"this is not JSON", stream=False)
            return
        build = {"/v1/completions": _completion, "/v1/responses": _response}.get(
            self.path, _message
        )
        self._send(build(stream), stream=stream)

    def _send(self, body: bytes, *, stream: bool) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream" if stream else "application/json")
        if not stream:
            self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _held(self) -> None:
        """A stream that sends its first chunk, then waits before the rest."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "held"}
        first = {**chunk, "choices": [{"index": 0, "delta": {"content": "hel"}}]}
        self.wfile.write(_sse((None, first)))
        self.wfile.flush()
        RELEASE.wait(10)
        try:
            last = {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            self.wfile.write(_sse((None, last), (None, "[DONE]")))
        except OSError:
            pass  # the client went away, as the test meant it to

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    with serving(_Stub) as url:
        yield url
    RELEASE.set()


@pytest.mark.parametrize("stream", [False, True])
async def test_completions_exchanges_keep_our_fields_on_each_choice(
    stub: str, stream: bool
) -> None:
    client = openai.AsyncOpenAI(base_url=stub, api_key="x", http_client=art.capture_http_client())
    with art.Trajectory() as t:
        answer = await client.completions.create(model="base", prompt="hi", stream=stream)
        if stream:
            text = "".join([chunk.choices[0].text async for chunk in answer if chunk.choices])  # type: ignore[union-attr]
        else:
            text = answer.choices[0].text  # type: ignore[union-attr]
    (exchange,) = t.exchanges.completions
    assert text == exchange.response.choices[0].text == "hello there"
    assert exchange.response.choices[0].finish_reason == "length"
    assert _ours(exchange) == OURS
    if stream:
        assert exchange.response.usage is not None
        assert exchange.response.usage.total_tokens == 5
    await client.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_exchanges_are_the_completed_response(stub: str, stream: bool) -> None:
    client = openai.AsyncOpenAI(base_url=stub, api_key="x", http_client=art.capture_http_client())
    with art.Trajectory() as t:
        answer = await client.responses.create(model="base", input="hi", stream=stream)
        if stream:
            kinds = [event.type async for event in answer]  # type: ignore[union-attr]
            assert kinds[-1] == "response.completed"
    (exchange,) = t.exchanges.responses
    assert exchange.response.output_text == "hello there"
    assert (exchange.request["input"], exchange.request.get("stream", False)) == ("hi", stream)
    assert _ours(exchange) == OURS
    await client.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_messages_exchanges_assemble_text_tool_input_and_our_fields(
    stub: str, stream: bool
) -> None:
    # The anthropic SDK 2.14 takes only its httpx2 fork's clients, which an httpx hook
    # cannot carry: the call is made as the SDK makes it, with its headers and body.
    body = {"model": "base", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-api-key": "x", "anthropic-version": "2023-06-01"}
    async with art.capture_http_client() as client:
        with art.Trajectory() as t:
            answer = await client.post(
                f"{stub}/messages", json={**body, "stream": stream}, headers=headers
            )
    (exchange,) = t.exchanges.messages
    assert isinstance(exchange.response, anthropic.types.Message)
    if not stream:
        assert exchange.response == anthropic.types.Message.model_validate(answer.json())
    text, call = exchange.response.content
    assert text.type == "text"
    assert text.text == "hello there"
    assert call.type == "tool_use"
    assert call.input == {"city": "Paris"}
    assert (exchange.response.stop_reason, exchange.response.usage.output_tokens) == ("tool_use", 2)
    assert exchange.response.usage.input_tokens == 3
    assert _ours(exchange) == OURS


# --- what the client gets is never changed; failures are logged --------------------------


def test_the_client_receives_the_same_bytes_inside_a_scope(stub: str) -> None:
    body = {"model": "base", "prompt": "hi", "stream": True}
    with art.capture_sync_http_client() as client:
        outside = client.post(f"{stub}/completions", json=body).content
        with art.Trajectory() as t:
            inside = client.post(f"{stub}/completions", json=body).content
    assert inside == outside == _completion(stream=True)
    assert len(t.exchanges.completions) == 1


def test_an_unreadable_answer_is_logged_and_the_client_still_gets_it(stub: str) -> None:
    session = art.capture_requests_session()
    with art.Trajectory() as t:
        answer = session.post(
            f"{stub}/chat/completions", json={"model": "garbled", "messages": ASK}
        )
    assert answer.content == b"this is not JSON"
    assert not t.exchanges
    (line,) = t.logs
    assert "/v1/chat/completions" in line
    assert "could not be read as chat_completions" in line
    session.close()


def test_a_legacy_trajectory_keeps_no_exchange_and_says_so(endpoint: str) -> None:
    session = art.capture_requests_session()
    with art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}]) as t:
        session.post(f"{endpoint}/chat/completions", json={"model": "base", "messages": ASK})
    assert not t.exchanges
    (line,) = t.logs
    assert "was not recorded" in line
    assert "messages_and_choices" in line
    session.close()


async def test_a_stream_closed_early_is_logged_once_and_never_recorded(stub: str) -> None:
    held = {"model": "held", "messages": ASK, "stream": True}
    client = art.capture_http_client()
    async with aiohttp.ClientSession(trace_configs=[art.capture_trace_config()]) as session:
        with art.Trajectory() as t:
            async with client.stream("POST", f"{stub}/chat/completions", json=held) as answer:
                async for _ in answer.aiter_bytes():
                    break  # the first chunk, then the client closes
            async with session.post(f"{stub}/chat/completions", json=held) as answer:
                chunks = answer.content.iter_any()
                await chunks.__anext__()
                await chunks.aclose()
            with art.capture_requests_session().post(
                f"{stub}/chat/completions", json=held, stream=True
            ) as streamed:
                next(streamed.iter_content(1))
    RELEASE.set()  # the stub's held answers may end now
    assert not t.exchanges
    assert len(t.logs) == 3
    assert all("closed before its body ended" in line for line in t.logs)
    await client.aclose()


async def test_a_stream_read_to_its_terminal_event_is_recorded_once(endpoint: str) -> None:
    body = {"model": "base", "messages": ASK, "stream": True}
    client = art.capture_http_client()
    with art.Trajectory() as t:
        async with client.stream("POST", f"{endpoint}/chat/completions", json=body) as answer:
            async for line in answer.aiter_lines():
                if line == "data: [DONE]":
                    break  # the answer is whole; the client stops reading here
    _assert_hello(t, [True])
    await client.aclose()
