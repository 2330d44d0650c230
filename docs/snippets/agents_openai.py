"""An agent on the OpenAI SDK, trained as it is: Chat Completions, Completions, Responses.

The agent's code is yours; where its client is made, it points at the model's endpoint
and carries art's capturing HTTP client (`art.capture_http_client()`, or
`art.capture_sync_http_client()` for the sync `OpenAI`). Every call it makes inside
`with art.Trajectory() as t:` lands in `t.exchanges` with the sampled token ids.
"""

from typing import Any

from openai import AsyncOpenAI, OpenAI

import art


# --8<-- [start:client]
def client_for(model: art.Model) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=model.inference_base_url,
        api_key=model.inference_api_key,
        http_client=art.capture_http_client(),  # records the calls made inside a trajectory
    )


# --8<-- [end:client]


# --8<-- [start:chat]
async def chat_agent(model: art.Model, question: str) -> None:
    await client_for(model).chat.completions.create(
        model=model.get_inference_name(),
        messages=[{"role": "user", "content": question}],
        max_tokens=8,
    )


# --8<-- [end:chat]


# --8<-- [start:rollout]
async def rollout(model: art.Model, question: str) -> art.Trajectory:
    with art.Trajectory() as trajectory:  # ART 0.5.23's capture scope
        await chat_agent(model, question)
    trajectory.reward = 1.0  # your reward: from the answer, a check, or RULER later
    return trajectory


# --8<-- [end:rollout]


# --8<-- [start:sync-stream]
async def sync_streaming_agent(model: art.Model, question: str) -> None:
    client = OpenAI(
        base_url=model.inference_base_url,
        api_key=model.inference_api_key,
        http_client=art.capture_sync_http_client(),
    )
    stream = client.chat.completions.create(
        model=model.get_inference_name(),
        messages=[{"role": "user", "content": question}],
        max_tokens=8,
        stream=True,
    )
    "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


# --8<-- [end:sync-stream]


# --8<-- [start:completions]
async def completions_agent(model: art.Model, question: str) -> None:
    await client_for(model).completions.create(
        model=model.get_inference_name(), prompt=f"Q: {question}\nA:", max_tokens=8
    )


# --8<-- [end:completions]


# --8<-- [start:responses]
async def responses_agent(model: art.Model, question: str) -> None:
    stream = await client_for(model).responses.create(
        model=model.get_inference_name(), input=question, max_output_tokens=8, stream=True
    )
    events: list[Any] = [event async for event in stream]
    assert events[-1].type == "response.completed"


# --8<-- [end:responses]
