"""An agent on Anthropic's SDK (Messages API, tools, streaming), trained as it is.

Anthropic's SDK adds `/v1/messages` to its base URL, so it is given the server's root.
"""

from typing import Any

from anthropic import AsyncAnthropic

import art

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


# --8<-- [start:agent]
async def anthropic_agent(model: art.Model, question: str) -> None:
    client = AsyncAnthropic(
        base_url=str(model.inference_base_url).removesuffix("/v1"),
        api_key=model.inference_api_key,
        http_client=art.capture_http_client(),
    )
    messages: list[Any] = [{"role": "user", "content": f"{question} Then check the weather."}]
    first = await client.messages.create(
        model=model.get_inference_name(),
        max_tokens=64,
        messages=messages,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
    results = [
        {"type": "tool_result", "tool_use_id": block.id, "content": "Sunny."}
        for block in first.content
        if block.type == "tool_use"
    ]
    # A call cut off by max_tokens comes back as text: then there is no result to send.
    messages.append({"role": "user", "content": results or "Go on."})
    async with client.messages.stream(
        model=model.get_inference_name(),
        max_tokens=8,
        messages=messages,
        tools=[WEATHER],  # type: ignore[list-item]
    ) as stream:
        await stream.get_final_message()


# --8<-- [end:agent]
