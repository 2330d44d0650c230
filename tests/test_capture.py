"""Zero-code capture: chat completions made by ordinary OpenAI clients become trajectories.

The main test runs a plain `AsyncOpenAI` agent loop against our local backend (token ids
from the real model); the grouping rules use the scripted chat server fixture, whose
answers are deterministic.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from openai import AsyncOpenAI, OpenAI
from openai.types.chat.chat_completion import Choice

import art
from art.integrations.capture._sse import choice_from_sse
from art.local import LocalBackend

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
CAPITALS = {"France": "Paris", "Japan": "Tokyo"}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup_capital",
        "description": "Look up the capital city of a country.",
        "parameters": {
            "type": "object",
            "properties": {"country": {"type": "string"}},
            "required": ["country"],
        },
    },
}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def model(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[art.TrainableModel]:
    path: Path = tmp_path_factory.mktemp("capture") / ".art"
    backend = LocalBackend(path=path, in_process=True)
    model = art.TrainableModel(name="agent", project="capture", base_model=BASE)
    await model.register(backend)
    yield model
    await backend.close()


def roles(items: list[Any]) -> list[str]:
    return ["assistant" if isinstance(item, Choice) else item["role"] for item in items]


async def openai_agent(base_url: str, api_key: str, model_name: str, country: str) -> None:
    """An agent loop as written against the OpenAI SDK, with no `art` in it but the reward."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    messages: list[Any] = [
        {"role": "system", "content": "You answer questions about countries."},
        {"role": "user", "content": f"What is the capital of {country}?"},
    ]
    first = await client.chat.completions.create(
        model=model_name,
        messages=messages,
        tools=[LOOKUP],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "lookup_capital"}},
        max_tokens=24,
    )
    message = first.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
        result = CAPITALS.get(arguments.get("country"), "unknown")
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    stream = await client.chat.completions.create(
        model=model_name,
        messages=messages,
        tools=[LOOKUP],  # type: ignore[list-item]
        tool_choice="none",
        max_tokens=8,
        stream=True,
    )
    answer = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    art.auto_trajectory(required=True).reward = float(CAPITALS[country] in answer)
    await client.close()


async def test_a_plain_openai_agent_loop_is_recorded_with_token_ids(
    model: art.TrainableModel,
) -> None:
    assert model.inference_base_url is not None
    trajectory = await art.capture_auto_trajectory(
        openai_agent(
            model.inference_base_url,
            model.inference_api_key or "none",
            model.get_inference_name(),
            "France",
        )
    )
    items = trajectory.messages_and_choices
    assert roles(items) == ["system", "user", "assistant", "tool", "assistant"]
    for choice in (items[2], items[4]):  # the tool call, and the streamed answer
        assert isinstance(choice, Choice)
        extra = choice.model_extra or {}
        assert extra["prompt_token_ids"]
        assert extra["token_ids"]
        assert len(extra["token_logprobs"]) == len(extra["token_ids"])
    assert isinstance(items[2], Choice)
    assert items[2].message.tool_calls
    assert items[3]["tool_call_id"] == items[2].message.tool_calls[0].id  # type: ignore[index]
    assert trajectory.tools == [LOOKUP]
    assert trajectory.additional_histories == []
    assert trajectory.reward in (0.0, 1.0)
    assert trajectory.metrics["duration"] > 0
    assert trajectory.logs == []


# --- how calls are grouped (scripted server) --------------------------------------------


async def test_a_conversation_extends_and_another_becomes_an_additional_history(
    chat_server_url: str,
) -> None:
    async def rollout() -> None:
        client = AsyncOpenAI(base_url=chat_server_url, api_key="k")
        messages: list[Any] = [{"role": "user", "content": "hello"}]
        first = await client.chat.completions.create(model="m", messages=messages)
        messages += [first.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "user", "content": "and again"}]
        await client.chat.completions.create(model="m", messages=messages)

        def summarize() -> None:  # a sync client, in a worker thread, another conversation
            with OpenAI(base_url=chat_server_url, api_key="k") as sync_client:
                sync_client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "summarize"}]
                )

        await asyncio.to_thread(summarize)
        await client.close()

    trajectory = await art.capture_auto_trajectory(rollout())
    assert [m["content"] for m in trajectory.messages()] == [
        "hello",
        "echo: hello",
        "and again",
        "echo: and again",
    ]
    assert roles(trajectory.messages_and_choices) == ["user", "assistant", "user", "assistant"]
    (history,) = trajectory.additional_histories
    assert [m["content"] for m in history.messages()] == ["summarize", "echo: summarize"]


async def test_concurrent_captures_keep_their_own_calls(chat_server_url: str) -> None:
    async def rollout(word: str) -> None:
        async with AsyncOpenAI(base_url=chat_server_url, api_key="k") as client:
            for _ in range(2):
                await asyncio.sleep(0)
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": word}]
                )

    words = [f"word{i}" for i in range(8)]
    trajectories = await asyncio.gather(
        *(art.capture_auto_trajectory(rollout(word)) for word in words)
    )
    for word, trajectory in zip(words, trajectories, strict=True):
        contents = {m["content"] for m in trajectory.messages()}
        for history in trajectory.additional_histories:
            contents |= {m["content"] for m in history.messages()}
        assert contents == {word, f"echo: {word}"}


async def test_outside_a_capture_nothing_is_recorded_and_httpx_is_restored(
    chat_server_url: str,
) -> None:
    send, async_send = httpx.Client.send, httpx.AsyncClient.send
    client = AsyncOpenAI(base_url=chat_server_url, api_key="k")

    async def rollout() -> None:
        assert art.auto_trajectory() is not None
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "in"}]
        )
        async with httpx.AsyncClient() as plain:  # not a chat completion: not recorded
            body = {"model": "m", "messages": [{"role": "user", "content": "other"}]}
            (await plain.post(f"{chat_server_url}/other", json=body)).raise_for_status()

    trajectory = await art.capture_auto_trajectory(rollout())
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "out"}])
    assert [m["content"] for m in trajectory.messages()] == ["in", "echo: in"]
    assert (httpx.Client.send, httpx.AsyncClient.send) == (send, async_send)
    assert art.auto_trajectory() is None
    await client.close()


def test_a_streamed_completion_is_reassembled_with_its_token_ids() -> None:
    def event(choice: dict[str, Any]) -> str:
        return "data: " + json.dumps(
            {"id": "c", "object": "chat.completion.chunk", "choices": [choice]}
        )

    body = "\n\n".join(
        [
            event({"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": None, "token_ids": [1], "prompt_token_ids": [5, 6]}),
            event({"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a"'}}]}, "finish_reason": None, "token_ids": [2], "prompt_token_ids": [5, 6]}),
            event({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}, "finish_reason": "tool_calls", "token_ids": [3]}),
            "data: [DONE]",
        ]
    ).encode()  # fmt: skip
    choice = choice_from_sse(body)
    assert choice.message.content == "Hi"
    assert choice.finish_reason == "tool_calls"
    call = (choice.message.tool_calls or [])[0]
    assert (call.id, call.function.name, call.function.arguments) == ("call_1", "f", '{"a": 1}')  # type: ignore[union-attr]
    assert choice.model_extra == {"token_ids": [1, 2, 3], "prompt_token_ids": [5, 6]}
    with pytest.raises(ValueError, match="before its choice finished"):
        choice_from_sse(body.split(b"\n\n")[0])


# --- ART's other capture names ----------------------------------------------------------


async def test_yield_trajectory_hands_the_trajectory_to_the_capture() -> None:
    async def deep_inside() -> None:
        art.yield_trajectory(art.Trajectory(reward=0.5))

    async def rollout() -> str:
        await deep_inside()
        return "the rollout's own return value"

    trajectory = await art.capture_yielded_trajectory(rollout())
    assert trajectory.reward == 0.5
    art.yield_trajectory(art.Trajectory())  # outside a capture: nothing to hand to, no error


async def test_capture_errors_say_what_to_do() -> None:
    async def yields_nothing() -> None:
        pass

    with pytest.raises(art.RolloutError, match="yield_trajectory"):
        await art.capture_yielded_trajectory(yields_nothing())
    with pytest.raises(art.RolloutError, match="capture_auto_trajectory"):
        art.auto_trajectory(required=True)
    with pytest.raises(art.ArtValueError, match="not the function"):
        await art.capture_auto_trajectory(yields_nothing)  # type: ignore[arg-type]
