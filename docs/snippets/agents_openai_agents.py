"""An agent on the OpenAI Agents SDK (Responses API, a function tool), trained as it is."""

from typing import Literal

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool
from openai import AsyncOpenAI

import art


@function_tool
def get_weather(city: Literal["Paris", "Tokyo", "Lima"]) -> str:
    """The weather in a city."""
    return f"Sunny in {city}."


# --8<-- [start:agent]
async def openai_agents_agent(model: art.Model, question: str) -> None:
    client = AsyncOpenAI(
        base_url=model.inference_base_url,
        api_key=model.inference_api_key,
        http_client=art.capture_http_client(),
    )
    agent = Agent(
        name="assistant",
        instructions="Answer, then check the weather.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=model.get_inference_name(), openai_client=client),
        # The 135M default model calls a tool only when made to; the tool's result ends the run.
        # The SDK fails a run whose answer hits max_tokens; a city out of a list keeps the
        # call (sampled under the tool's JSON schema) well inside it, whatever is sampled.
        model_settings=ModelSettings(tool_choice="required", max_tokens=48),
        tool_use_behavior="stop_on_first_tool",
    )
    await Runner.run(agent, question, max_turns=2)


# --8<-- [end:agent]
