"""Structured output from our engine: `response_format` and forced tool calls, constrained.

One in-process backend serves the default model, in the dtype art picks, for the whole
module (fp32 samples several times slower on a busy 2-core CPU).
"""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import jsonschema
import pytest
import pytest_asyncio
import torch

import art
from art.local import LocalBackend

pytestmark = pytest.mark.model  # loads the default model or starts a model service

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
MOVIE = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 24},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
        "genre": {"enum": ["drama", "comedy", "horror"]},
        "cast": {
            "type": "array",
            "minItems": 1,
            "maxItems": 2,
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 16}},
                "required": ["name"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["title", "year", "genre", "cast"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(shared_backend: LocalBackend) -> art.TrainableModel:
    model = art.TrainableModel(name="structured", project="structured", base_model=BASE)
    await model.register(shared_backend)
    return model


def movie_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": {"name": "movie", "schema": schema, "strict": True},
    }


def ask(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


@pytest.mark.sampling
async def test_twenty_samples_at_temperature_1_validate_against_the_schema_when_they_end(
    served: art.TrainableModel, default_model: tuple[Any, Any], test_seed: int
) -> None:
    completion = await served.openai_client().chat.completions.create(
        model=served.name,
        messages=ask("Describe a movie as JSON."),  # type: ignore[arg-type]
        response_format=movie_format(MOVIE),  # type: ignore[arg-type]
        n=20,
        temperature=1.0,
        max_tokens=96,
        seed=7 + test_seed,
    )
    assert len(completion.choices) == 20
    # At temperature 1 a sample may run into max_tokens (one CPU's bf16 sums drew a title
    # in Japanese, ~3 tokens a character): such a sample is cut at exactly 96 tokens, not
    # ended early by the grammar. Every sample that ended validates.
    stopped = [choice for choice in completion.choices if choice.finish_reason == "stop"]
    for choice in completion.choices:
        if choice.finish_reason != "stop":
            assert choice.finish_reason == "length", choice.finish_reason
            assert len((choice.model_extra or {})["token_ids"]) == 96
    assert len(stopped) >= 17, [choice.message.content for choice in completion.choices]
    for choice in stopped:
        jsonschema.validate(json.loads(choice.message.content or ""), MOVIE)
    assert len({choice.message.content for choice in stopped}) > 10

    # The ids and logprobs training reads are there, and the logprobs are the model's
    # own (unmasked, temperature 1), not those of the constrained distribution, under
    # which a forced token would have logprob 0. (Served in bf16 here, checked in fp32.)
    model, tokenizer = default_model
    choice = stopped[0]
    extra = choice.model_extra or {}
    prompt_ids, token_ids, logprobs = (
        extra["prompt_token_ids"],
        extra["token_ids"],
        extra["token_logprobs"],
    )
    assert len(token_ids) == len(logprobs) >= 10
    assert token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.decode(token_ids, skip_special_tokens=True) == choice.message.content
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + token_ids])).logits[0, len(prompt_ids) - 1 : -1]
    expected = torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(token_ids)[:, None])
    for got, want in zip(logprobs, expected[:, 0].tolist(), strict=True):
        assert math.isclose(got, want, abs_tol=0.5), (got, want)  # bf16 against fp32
    assert any(logprob < -0.01 for logprob in logprobs)  # forced tokens keep their own odds


@pytest.mark.sampling
async def test_json_object_returns_a_json_object_and_streams(
    served: art.TrainableModel, test_seed: int
) -> None:
    client = served.openai_client()
    request: dict[str, Any] = {
        "model": served.name,
        "messages": ask('Reply with a JSON object like {"name": "Ada", "age": 36}.'),
        "response_format": {"type": "json_object"},
        "max_tokens": 96,
        "seed": 3 + test_seed,
    }
    completion = await client.chat.completions.create(**request)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(json.loads(choice.message.content or ""), dict)

    text = ""
    async for chunk in await client.chat.completions.create(**request, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text == choice.message.content  # the same seed samples the same object


@pytest.mark.sampling
async def test_a_forced_tool_calls_arguments_follow_its_parameters(
    served: art.TrainableModel, test_seed: int
) -> None:
    completion = await served.openai_client().chat.completions.create(
        model=served.name,
        messages=ask("What is the weather in Paris?"),  # type: ignore[arg-type]
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        n=4,
        temperature=1.0,
        max_tokens=48,
        seed=5 + test_seed,
    )
    for choice in completion.choices:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls is not None
        call = choice.message.tool_calls[0].function  # type: ignore[union-attr]
        assert call.name == "get_weather"
        parameters = WEATHER_TOOL["function"]["parameters"]  # type: ignore[index]
        jsonschema.validate(json.loads(call.arguments), parameters)


@pytest.mark.sampling
async def test_required_among_several_tools_calls_one_of_them_with_valid_arguments(
    served: art.TrainableModel, test_seed: int
) -> None:
    time_tool = {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The local time in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 24}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    tools = [WEATHER_TOOL, time_tool]
    completion = await served.openai_client().chat.completions.create(
        model=served.name,
        messages=ask("What time is it in Paris?"),  # type: ignore[arg-type]
        tools=tools,  # type: ignore[arg-type]
        tool_choice="required",
        n=4,
        temperature=1.0,
        max_tokens=48,
        seed=5 + test_seed,
    )
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}  # type: ignore[index]
    for choice in completion.choices:
        assert choice.finish_reason == "tool_calls", choice.message.content
        assert choice.message.tool_calls is not None
        call = choice.message.tool_calls[0].function  # type: ignore[union-attr]
        jsonschema.validate(json.loads(call.arguments), by_name[call.name])


async def test_a_bad_schema_is_a_400_naming_response_format_and_serving_goes_on(
    served: art.TrainableModel,
) -> None:
    headers = {"Authorization": f"Bearer {served.inference_api_key}"}
    good = {"model": served.name, "messages": ask("Hi"), "max_tokens": 8}
    bad_formats = [
        movie_format({"type": "objectx"}),
        movie_format({"type": "object", "properties": 5}),
        movie_format({"type": "string", "pattern": "(("}),
        {"type": "json_schema", "json_schema": {"name": "no_schema"}},
        {"type": "yaml"},
    ]
    async with httpx.AsyncClient(
        base_url=served.inference_base_url, headers=headers, timeout=120
    ) as http:
        for response_format in bad_formats:
            response = await http.post(
                "/chat/completions", json={**good, "response_format": response_format}
            )
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == "response_format", error
            assert "response_format" in error["message"], error
        still = await http.post(
            "/chat/completions", json={**good, "response_format": movie_format(MOVIE)}
        )
        assert still.status_code == 200
        assert still.json()["choices"][0]["finish_reason"] == "length"  # 8 tokens: cut short


def test_each_distinct_schema_compiles_once(default_model: tuple[Any, Any]) -> None:
    from art.runtime.engines.structured import Grammars

    grammars = Grammars(default_model[1], {2})
    first = grammars.json_schema(MOVIE)
    reordered = json.loads(json.dumps(MOVIE, sort_keys=True))
    assert grammars.json_schema(reordered) is first
    assert grammars.json_schema({"type": "object"}) is not first
