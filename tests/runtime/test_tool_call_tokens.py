"""`parallel_tool_calls=False`: the returned token ids end where the one kept call ends.

The choice is built by the endpoint's own code from a sample of the real default-model
tokenizer's ids (the sampler's text written out, as the 135M model rarely writes two
calls on its own), so the check covers exactly what a rollout would get back.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from art.runtime.endpoint.request import ChatCompletionRequest
from art.runtime.endpoint.response import Job, Route, choice
from art.runtime.engines.base import Sample, SamplingParams

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("get_weather", "get_time")
]
FIRST = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
SECOND = '\n<tool_call>{"name": "get_time", "arguments": {"city": "Rome"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(default_model: tuple[Any, Any]) -> Any:
    return default_model[1]


def choice_for(tokenizer: Any, text: str, *, parallel: bool) -> dict[str, Any]:
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    sample = Sample(
        token_ids=ids,
        logprobs=[-0.01 * (i + 1) for i in range(len(ids))],
        finish_reason="stop",
        text=tokenizer.decode(ids, skip_special_tokens=True),
    )
    body = ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "Weather in Paris, time in Rome?"}],
        tools=TOOLS,
        parallel_tool_calls=parallel,
        logprobs=True,
    )
    job = Job(
        prompt_ids=[1, 2, 3],
        params=SamplingParams(max_tokens=64),
        prefill="",
        forced_tool=None,
        tool_names=("get_weather", "get_time"),
    )
    # The engine is not used to build a choice; the tokenizer is the model's own.
    route = Route(None, tokenizer, None, None, 2048)  # type: ignore[arg-type]
    return choice(body, route, job, 0, sample)


def test_without_parallel_calls_the_trained_tokens_end_with_the_kept_call(tokenizer: Any) -> None:
    both = choice_for(tokenizer, FIRST + SECOND, parallel=True)
    assert [c["function"]["name"] for c in both["message"]["tool_calls"]] == [
        "get_weather",
        "get_time",
    ]
    one = choice_for(tokenizer, FIRST + SECOND, parallel=False)
    (call,) = one["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    kept = one["token_ids"]
    assert kept == both["token_ids"][: len(kept)]
    assert len(kept) < len(both["token_ids"])
    assert tokenizer.decode(kept, skip_special_tokens=True) == FIRST
    assert one["token_logprobs"] == both["token_logprobs"][: len(kept)]
    assert len(one["logprobs"]["content"]) == len(kept)


def test_a_single_call_keeps_every_token(tokenizer: Any) -> None:
    whole = choice_for(tokenizer, FIRST, parallel=False)
    assert tokenizer.decode(whole["token_ids"], skip_special_tokens=True) == FIRST
