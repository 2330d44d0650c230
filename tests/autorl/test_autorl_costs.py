"""AutoRL's generator calls are costed as ART's `costs/<context>/autorl/inputs`."""

from __future__ import annotations

import json

import pytest
from conftest import ScriptedChat

from art.autorl import generate_inputs
from art.metrics import MetricsBuilder


async def test_each_generator_call_is_costed_in_the_active_context(
    scripted_chat: ScriptedChat,
) -> None:
    scripted_chat.answers = [
        json.dumps({"inputs": ["Can I return shoes?", "Do you refund shipping?"]}),
        json.dumps({"system_prompt": "You are the shop's returns assistant."}),
        json.dumps({"inputs": ["Can I return a gift?", "How long do refunds take?"]}),
    ]
    params = {"api_base": scripted_chat.url, "api_key": "k"}
    builder = MetricsBuilder("train")
    with builder.activate_context():
        await generate_inputs(
            "Answer questions about returns.",
            2,
            generator_model="openai/gpt-4o-mini",
            extra_litellm_params=params,
        )
        # A generator no price table knows (a model on our own endpoint) costs nothing here.
        await generate_inputs(
            "Answer questions about returns.",
            2,
            generator_model="openai/our-generator",
            extra_litellm_params=params,
            system_prompt="Be brief.",
        )
    flushed = await builder.flush()
    # Two calls (inputs, system prompt) of 100 prompt and 20 completion tokens each at
    # gpt-4o-mini's list price.
    assert flushed["costs/train/autorl/inputs"] == pytest.approx(2 * (100 * 0.15 + 20 * 0.60) / 1e6)
    assert flushed["costs/all"] == flushed["costs/train/autorl/inputs"]
    assert len(scripted_chat.requests) == 3
