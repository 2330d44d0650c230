"""ART's `art.costs` and `art.api_costs`: prices, what a response cost, `track_api_cost`.

Expected costs are worked by hand from the list prices (US dollars per million tokens).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import art.api_costs as api_costs
import art.costs as costs
from art.metrics import MetricsBuilder


def test_model_pricing_is_looked_up_and_strict_names_the_missing_model() -> None:
    pricing = costs.get_model_pricing("Qwen/Qwen3-8B")
    assert pricing == costs.ModelPricing(prefill=0.13, sample=0.40, train=0.40)
    assert costs.get_model_pricing("my/own-model") is None
    assert costs.get_model_pricing(None, strict=True) is None
    with pytest.raises(ValueError, match="'my/own-model' has no price"):
        costs.get_model_pricing("my/own-model", strict=True)


def test_sample_and_train_costs_are_named_as_arts_cost_metrics() -> None:
    pricing = costs.ModelPricing(prefill=2.0, sample=10.0, train=4.0)
    expected = {
        "costs/train/tinker_prefill": 3_000 * 2.0 / 1e6,
        "costs/train/tinker_sample": 500 * 10.0 / 1e6,
    }
    assert (
        costs.compute_sample_costs(
            prompt_tokens=3_000, completion_tokens=500, cost_context="/train/", pricing=pricing
        )
        == expected
    )
    calculate = costs.build_cost_calculator(pricing)
    assert calculate(None, 500, "eval") == {
        "costs/eval/tinker_prefill": 0.0,
        "costs/eval/tinker_sample": 0.005,
    }
    assert costs.compute_train_cost(250_000, pricing) == pytest.approx(1.0)
    assert costs.tokens_to_cost(1_000_000, 0.5) == 0.5
    with pytest.raises(ValueError, match="cost_context"):
        calculate(1, 1, "/")


def test_openai_usage_is_priced_with_its_cached_prompt_tokens() -> None:
    response = {
        "usage": {
            "prompt_tokens": 1_000,
            "completion_tokens": 500,
            "prompt_tokens_details": {"cached_tokens": 200},
        }
    }
    # gpt-4.1 in MODEL_TOKEN_PRICING: 2.0 prompt, 0.5 cached prompt, 8.0 completion.
    cost = api_costs.extract_api_cost(response, provider="OpenAI ", model_name="openai/gpt-4.1")
    assert cost == pytest.approx((800 * 2.0 + 200 * 0.5 + 500 * 8.0) / 1e6)
    overridden = api_costs.extract_api_cost(
        response,
        provider="openai",
        model_name="openai/gpt-4.1",
        completion_price_per_million=1.0,
        cached_prompt_price_per_million=None,
    )
    assert overridden == pytest.approx((800 * 2.0 + 200 * 0.5 + 500 * 1.0) / 1e6)


def test_anthropic_usage_is_priced_with_cache_writes_and_reads() -> None:
    class Usage:  # an SDK object, read by attribute
        input_tokens = 1_000
        output_tokens = 100
        cache_creation_input_tokens = 400
        cache_read_input_tokens = 2_000

    class Message:
        usage = Usage()

    cost = api_costs.extract_api_cost(
        Message(), provider="anthropic", model_name="anthropic/claude-sonnet-4-6"
    )
    assert cost == pytest.approx((1_000 * 3.0 + 400 * 3.75 + 2_000 * 0.30 + 100 * 15.0) / 1e6)


def test_litellms_price_list_and_the_hosted_table_price_what_arts_table_lacks() -> None:
    usage = {"usage": {"prompt_tokens": 100, "completion_tokens": 20}}
    # gpt-4o-mini from LiteLLM's installed list: 0.15 prompt, 0.60 completion.
    assert api_costs.extract_api_cost(
        usage, provider="openai", model_name="openai/gpt-4o-mini"
    ) == pytest.approx((100 * 0.15 + 20 * 0.60) / 1e6)
    # Qwen3-8B from art.costs.MODEL_PRICING: prefill 0.13, sample 0.40.
    assert api_costs.extract_api_cost(
        usage, provider="openai", model_name="Qwen/Qwen3-8B"
    ) == pytest.approx((100 * 0.13 + 20 * 0.40) / 1e6)


def test_a_cost_the_response_states_wins_over_token_pricing() -> None:
    stated = {"usage": {"prompt_tokens": 100, "completion_tokens": 20, "cost": 0.25}}
    assert api_costs.extract_api_cost(stated, provider="openai", model_name="unpriced") == 0.25
    breakdown = {"usage": {"cost": {"total_cost": "0.5"}}}
    assert api_costs.extract_api_cost(breakdown, provider="x", model_name="unpriced") == 0.5

    class Proxied:  # LiteLLM's proxy states the cost in a header LiteLLM keeps
        usage = None

        def __init__(self) -> None:
            headers = {"llm_provider-x-litellm-response-cost": 0.125}
            self._hidden_params = {"additional_headers": headers}

    assert api_costs.extract_api_cost(Proxied(), provider="x", model_name="unpriced") == 0.125


def test_what_nothing_can_price_is_an_error_that_says_how_to_price_it() -> None:
    usage = {"usage": {"prompt_tokens": 100, "completion_tokens": 20}}
    with pytest.raises(api_costs.CostUnavailableError, match="register_model_pricing"):
        api_costs.extract_api_cost(usage, provider="openai", model_name="openai/our-own-model")
    with pytest.raises(api_costs.CostUnavailableError, match="register_cost_extractor"):
        api_costs.extract_api_cost(usage, provider="openrouter", model_name="openai/gpt-4.1")
    with pytest.raises(ValueError, match="no anthropic token counts"):
        api_costs.extract_api_cost(usage, provider="anthropic", model_name="openai/gpt-4.1")
    with pytest.raises(ValueError, match="provider"):
        api_costs.extract_api_cost(usage, provider=" ", model_name="openai/gpt-4.1")
    # A custom extractor, and a registered price, come before the tables.
    assert (
        api_costs.extract_api_cost(
            usage,
            provider="openrouter",
            model_name="x",
            cost_extractors={"openrouter": lambda response: 0.75},
        )
        == 0.75
    )
    registered = {"openai/our-own-model": api_costs.TokenPricing(1.0, 2.0)}
    assert api_costs.extract_api_cost(
        usage, provider="openai", model_name="openai/our-own-model", model_pricing=registered
    ) == pytest.approx((100 * 1.0 + 20 * 2.0) / 1e6)


def test_track_api_cost_records_into_the_active_builder_only() -> None:
    usage = {"usage": {"prompt_tokens": 1_000_000, "completion_tokens": 0}}

    @api_costs.track_api_cost(
        source="/tools/search/", provider="openai", model_name="openai/gpt-4.1"
    )
    def search(query: str) -> dict[str, Any]:
        return usage | {"query": query}

    @api_costs.track_api_cost(
        source="judge",
        provider="openai",
        model_name="openai/gpt-4.1",
        response_getter=lambda result: result[1],
        prompt_price_per_million=4.0,
    )
    async def judge() -> tuple[str, dict[str, Any]]:
        return "verdict", usage

    assert search("outside")["query"] == "outside"  # no active builder: nothing to record
    assert search.__name__ == "search"
    builder = MetricsBuilder("train")
    with builder.activate_context():
        search("a")
        search("b")
        assert asyncio.run(judge()) == ("verdict", usage)
    flushed = asyncio.run(builder.flush())
    assert flushed["costs/train/tools/search"] == pytest.approx(4.0)  # 2 x 1M tokens at 2.0
    assert flushed["costs/train/judge"] == pytest.approx(4.0)
    assert flushed["costs/all"] == pytest.approx(8.0)

    with pytest.raises(ValueError, match="source"):
        api_costs.track_api_cost(source="//", provider="openai", model_name="m")
    with pytest.raises(ValueError, match="provider"):
        api_costs.track_api_cost(source="s", provider="", model_name="m")
    with pytest.raises(ValueError, match="model_name"):
        api_costs.track_api_cost(source="s", provider="openai", model_name=" ")


def test_a_price_keyword_that_is_not_one_is_refused_by_name_where_it_is_given() -> None:
    misspelt = {"prompt_price_per_milion": 1.0}
    with pytest.raises(TypeError, match=r"track_api_cost.*'prompt_price_per_milion'"):
        api_costs.track_api_cost(source="s", provider="openai", model_name="m", **misspelt)
    with pytest.raises(TypeError, match=r"extract_api_cost.*'prompt_price_per_milion'"):
        api_costs.extract_api_cost({}, provider="openai", model_name="m", **misspelt)
    with pytest.raises(TypeError, match=r"add_response_cost.*'prompt_price_per_milion'"):
        MetricsBuilder(cost_context="train").add_response_cost(
            "s",
            {},
            provider="openai",
            model_name="m",
            **misspelt,
        )


def test_an_unpriced_tracked_call_inside_a_context_raises_after_the_call() -> None:
    calls: list[int] = []

    @api_costs.track_api_cost(source="s", provider="openai", model_name="openai/our-own-model")
    def call() -> dict[str, Any]:
        calls.append(1)
        return {"usage": {"prompt_tokens": 1}}

    with MetricsBuilder("train").activate_context(), pytest.raises(api_costs.CostUnavailableError):
        call()
    assert calls == [1]
