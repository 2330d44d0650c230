"""Capture an agent written without LangGraph: every chat completion for the trained
model made through `model.openai_client()` inside `capture_auto_trajectory` is recorded."""

import art


async def agent(model: art.Model, question: str) -> None:
    client = model.openai_client()
    await client.chat.completions.create(
        model=model.get_inference_name(),
        messages=[{"role": "user", "content": question}],
        max_tokens=16,
    )
    art.auto_trajectory(required=True).reward = 1.0  # the trajectory being built


async def rollout(model: art.Model, question: str) -> art.Trajectory:
    return await art.capture_auto_trajectory(agent(model, question))
