"""Capture: chat completions made through `model.openai_client()` become trajectories.

The main test runs a plain OpenAI-SDK agent loop against our local backend (token ids
from the real model); the grouping rules use the chat server fixture, whose answers are
deterministic, behind an `art.Model`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import pytest_asyncio
from openai import AsyncOpenAI, OpenAI
from openai.types.chat.chat_completion import Choice

import art
from art.core.capture.exchange_capture import assemble_chat_stream
from art.integrations.capture import RecordingTransport
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
async def model(shared_backend: LocalBackend) -> art.TrainableModel:
    model = art.TrainableModel(name="capture-agent", project="capture", base_model=BASE)
    await model.register(shared_backend)
    return model


def roles(items: list[Any]) -> list[str]:
    return ["assistant" if isinstance(item, Choice) else item["role"] for item in items]


def echo_model(url: str) -> art.Model:
    """An `art.Model` served by the echoing chat server fixture."""
    return art.Model(name="m", project="capture", inference_base_url=url, inference_api_key="k")


async def openai_agent(client: AsyncOpenAI, model_name: str, country: str) -> None:
    """An agent loop as written against the OpenAI SDK, with no `art` in it but the reward."""
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
        temperature=0,  # plumbing: greedy, so no draw decides whether the call closes
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
        temperature=0,
        stream=True,
    )
    answer = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    art.auto_trajectory(required=True).reward = float(CAPITALS[country] in answer)


async def test_a_plain_openai_agent_loop_is_recorded_with_token_ids(
    model: art.TrainableModel,
) -> None:
    trajectory = await art.capture_auto_trajectory(
        openai_agent(model.openai_client(), model.get_inference_name(), "France")
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
    client = echo_model(chat_server_url).openai_client()

    async def rollout() -> None:
        messages: list[Any] = [{"role": "user", "content": "hello"}]
        first = await client.chat.completions.create(model="m", messages=messages)
        messages += [first.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "user", "content": "and again"}]
        await client.chat.completions.create(model="m", messages=messages)

        def summarize() -> None:  # a sync client of the user's, in a worker thread
            recording = httpx.Client(transport=RecordingTransport())
            with OpenAI(base_url=chat_server_url, api_key="k", http_client=recording) as sync:
                sync.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "summarize"}]
                )

        await asyncio.to_thread(summarize)

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
    client = echo_model(chat_server_url).openai_client()  # one client shared by all

    async def rollout(word: str) -> None:
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


async def test_only_the_models_own_calls_inside_a_capture_are_recorded(
    chat_server_url: str,
) -> None:
    send, async_send = httpx.Client.send, httpx.AsyncClient.send
    client = echo_model(chat_server_url).openai_client()
    plain = AsyncOpenAI(base_url=chat_server_url, api_key="k")  # the user's own client

    async def rollout() -> None:
        assert (httpx.Client.send, httpx.AsyncClient.send) == (send, async_send)
        assert art.auto_trajectory() is not None
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "in"}]
        )
        # A judge on the same endpoint, under another model name: not the trained model.
        await client.chat.completions.create(
            model="judge", messages=[{"role": "user", "content": "judge this"}]
        )
        # A client not made by art carries no recording transport.
        await plain.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "plain client"}]
        )
        async with httpx.AsyncClient() as other:  # not a chat completion: not recorded
            body = {"model": "m", "messages": [{"role": "user", "content": "other"}]}
            (await other.post(f"{chat_server_url}/other", json=body)).raise_for_status()

    trajectory = await art.capture_auto_trajectory(rollout())
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "out"}])
    assert [m["content"] for m in trajectory.messages()] == ["in", "echo: in"]
    assert trajectory.additional_histories == []
    assert art.auto_trajectory() is None
    await plain.close()


async def test_every_choice_of_n_samples_is_recorded(model: art.TrainableModel) -> None:
    client = model.openai_client()
    prompt = [{"role": "user", "content": "Name a color."}]

    async def rollout() -> None:
        await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=prompt,
            n=3,
            max_tokens=6,  # type: ignore[arg-type]
        )
        stream = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=prompt,  # type: ignore[arg-type]
            n=2,
            max_tokens=6,
            stream=True,
        )
        async for _ in stream:
            pass
        # The bare name routes to the same model while it is unambiguous: recorded too.
        await client.chat.completions.create(
            model=model.name,
            messages=prompt,
            max_tokens=6,  # type: ignore[arg-type]
        )

    trajectory = await art.capture_auto_trajectory(rollout())
    histories = [trajectory, *trajectory.additional_histories]
    assert len(histories) == 6
    for history in histories:
        (user, choice) = history.messages_and_choices
        assert user == prompt[0]
        assert isinstance(choice, Choice)
        assert (choice.model_extra or {})["token_ids"]
    indices = [h.messages_and_choices[1].index for h in histories]  # type: ignore[union-attr]
    assert indices == [0, 1, 2, 0, 1, 0]


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
    choice = Choice.model_validate(assemble_chat_stream(body)[1][0])
    assert choice.message.content == "Hi"
    assert choice.finish_reason == "tool_calls"
    call = (choice.message.tool_calls or [])[0]
    assert (call.id, call.function.name, call.function.arguments) == ("call_1", "f", '{"a": 1}')  # type: ignore[union-attr]
    assert choice.model_extra == {"token_ids": [1, 2, 3], "prompt_token_ids": [5, 6]}
    with pytest.raises(ValueError, match=r"before choices \[0\] finished"):
        assemble_chat_stream(body.split(b"\n\n")[0] + b"\n\n")  # the first event alone


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


# --- an agent that makes its own client ---------------------------------------------------


async def own_client_agent(client: AsyncOpenAI) -> None:
    """An existing agent: it makes its own client and sets only the reward."""
    completion = await client.chat.completions.create(
        model="external-model", messages=[{"role": "user", "content": "hello"}]
    )
    art.auto_trajectory(required=True).reward = float(
        "hello" in (completion.choices[0].message.content or "")
    )


async def test_a_client_the_agent_made_itself_is_recorded_with_capture_http_client(
    chat_server_url: str,
) -> None:
    client = AsyncOpenAI(
        base_url=chat_server_url,
        api_key="k",
        http_client=art.capture_http_client(),  # type: ignore[arg-type]
    )
    trajectory = await art.capture_auto_trajectory(own_client_agent(client))
    assert roles(trajectory.messages_and_choices) == ["user", "assistant"]
    choice = trajectory.messages_and_choices[1]
    assert isinstance(choice, Choice)
    assert choice.message.content == "echo: hello"
    assert trajectory.reward == 1.0
    await client.close()


async def test_a_capture_that_recorded_nothing_raises_naming_the_fix(
    chat_server_url: str,
) -> None:
    """Without the recording client the call reaches the server unseen: never an empty
    trajectory returned as if it were the rollout."""
    client = AsyncOpenAI(base_url=chat_server_url, api_key="k")
    with pytest.raises(art.RolloutError, match=r"http_client=art\.capture_http_client\(\)"):
        await art.capture_auto_trajectory(own_client_agent(client))
    await client.close()
