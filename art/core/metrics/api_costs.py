"""What a hosted-API call cost, read from its response (`art.core.metrics.cost_tracking` records it).

ART's `art.api_costs`. The cost of one response is, in order:

1. the cost the response states itself: `usage.cost` (OpenRouter and LiteLLM's proxy
   send it), or LiteLLM's `x-litellm-response-cost` header;
2. a cost extractor registered for the provider (`MetricsBuilder.register_cost_extractor`);
3. the response's token counts (OpenAI's `prompt_tokens`/`completion_tokens` with cached
   prompt tokens, or Anthropic's `input_tokens`/`output_tokens` with cache writes and
   reads) at the model's price: one registered with `MetricsBuilder.register_model_pricing`,
   else `MODEL_TOKEN_PRICING`, else LiteLLM's price list (read from the copy installed with
   LiteLLM: `LITELLM_LOCAL_MODEL_COST_MAP=True`), else `art.costs.MODEL_PRICING`.

A call none of these can price raises `CostUnavailableError` (a ValueError). A model
served by this library's own endpoint is in none of the tables, so its calls are
unpriced: nothing is recorded for them unless a price is registered.

Costs are recorded into the active `MetricsBuilder` (`model.activate_metrics_context(
"train")`) as `costs/<context>/<source>`, and reach `history.jsonl` at the model's next
log of that split.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ParamSpec, TypedDict, TypeVar, Unpack, cast

from ..data.errors import ArtValueError
from .costs import get_model_pricing, tokens_to_cost

OPENAI_PROVIDER = "openai"
ANTHROPIC_PROVIDER = "anthropic"

P = ParamSpec("P")
R = TypeVar("R")

CostExtractor = Callable[[Any], float | None]
"""Reads a response's cost in US dollars, or None to fall back to token pricing."""

_RESPONSE_COST_HEADER = "llm_provider-x-litellm-response-cost"


class CostUnavailableError(ArtValueError):
    """A response whose cost cannot be worked out: an unpriced model, a provider with no
    extractor, or usage that is not the provider's shape."""


@dataclass(frozen=True)
class TokenPricing:
    """US dollars per million tokens; the cache prices default to the prompt price."""

    prompt_per_million: float
    completion_per_million: float
    cached_prompt_per_million: float | None = None
    cache_creation_per_million: float | None = None
    cache_read_per_million: float | None = None


# ART 0.5.23's own entries, consulted before LiteLLM's list.
MODEL_TOKEN_PRICING: dict[str, TokenPricing] = {
    "openai/gpt-4.1": TokenPricing(
        prompt_per_million=2.0, completion_per_million=8.0, cached_prompt_per_million=0.5
    ),
    "anthropic/claude-sonnet-4-6": TokenPricing(
        prompt_per_million=3.0,
        completion_per_million=15.0,
        cache_creation_per_million=3.75,
        cache_read_per_million=0.30,
    ),
}


def load_litellm() -> ModuleType:
    """`litellm`, imported with its price list read from the installed copy.

    Without `LITELLM_LOCAL_MODEL_COST_MAP` LiteLLM fetches that list from GitHub as it is
    imported, which an offline machine waits on; a value the caller set is kept.
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    return litellm


def normalize_provider(provider: str | None) -> str | None:
    """`provider` stripped and lower-cased; None for None or blank."""
    if provider is None:
        return None
    return provider.strip().lower() or None


def normalize_model_name(model_name: str | None) -> str | None:
    """`model_name` stripped; None for None or blank."""
    if model_name is None:
        return None
    return model_name.strip() or None


def _field(container: Any, name: str) -> Any:
    if container is None:
        return None
    if isinstance(container, Mapping):
        return container.get(name)
    return getattr(container, name, None)


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _cost_value(value: Any) -> float | None:
    # A stated cost is a number, or an object with `total_cost` (OpenRouter's breakdown).
    number = _number(value)
    return number if number is not None else _number(_field(value, "total_cost"))


def _stated_cost(response: Any) -> float | None:
    usage = _field(response, "usage")
    for cost in (_field(usage, "cost"), _field(_field(usage, "model_extra"), "cost")):
        value = _cost_value(cost)
        if value is not None:
            return value
    headers = _field(_field(response, "_hidden_params"), "additional_headers")
    return _cost_value(_field(headers, _RESPONSE_COST_HEADER))


def _litellm_pricing(model_name: str) -> TokenPricing | None:
    litellm = load_litellm()
    try:
        info = litellm.get_model_info(model_name)
    except Exception:  # LiteLLM raises a bare Exception for a model it has no entry for
        return None
    if not isinstance(info, Mapping):
        return None

    def per_million(key: str) -> float | None:
        value = _number(info.get(key))
        return None if value is None else value * 1_000_000

    prompt, completion = per_million("input_cost_per_token"), per_million("output_cost_per_token")
    if prompt is None or completion is None:
        return None
    cache_read = per_million("cache_read_input_token_cost")
    return TokenPricing(
        prompt_per_million=prompt,
        completion_per_million=completion,
        cached_prompt_per_million=cache_read,
        cache_creation_per_million=per_million("cache_creation_input_token_cost"),
        cache_read_per_million=cache_read,
    )


def default_token_pricing(model_name: str) -> TokenPricing | None:
    """The price of `model_name` from the shipped tables: `MODEL_TOKEN_PRICING`, then
    LiteLLM's list, then `art.costs.MODEL_PRICING` (prefill and sample prices)."""
    if (explicit := MODEL_TOKEN_PRICING.get(model_name)) is not None:
        return explicit
    if (listed := _litellm_pricing(model_name)) is not None:
        return listed
    hosted = get_model_pricing(model_name)
    if hosted is None:
        return None
    return TokenPricing(prompt_per_million=hosted.prefill, completion_per_million=hosted.sample)


def _openai_cost(usage: Any, pricing: TokenPricing) -> float | None:
    prompt = _number(_field(usage, "prompt_tokens"))
    completion = _number(_field(usage, "completion_tokens"))
    cached = _number(_field(_field(usage, "prompt_tokens_details"), "cached_tokens")) or 0.0
    if prompt is None and completion is None and cached == 0.0:
        return None
    prompt = prompt or 0.0
    cached = min(cached, prompt)
    cached_price = pricing.cached_prompt_per_million
    return (
        tokens_to_cost(prompt - cached, pricing.prompt_per_million)
        + tokens_to_cost(
            cached, pricing.prompt_per_million if cached_price is None else cached_price
        )
        + tokens_to_cost(completion or 0.0, pricing.completion_per_million)
    )


def _anthropic_cost(usage: Any, pricing: TokenPricing) -> float | None:
    counts = [
        _number(_field(usage, name))
        for name in (
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        )
    ]
    if counts[0] is None and counts[1] is None and not counts[2] and not counts[3]:
        return None
    input_tokens, output_tokens, writes, reads = (count or 0.0 for count in counts)
    prompt = pricing.prompt_per_million

    def price_or_prompt(price: float | None) -> float:
        return prompt if price is None else price

    return (
        tokens_to_cost(input_tokens, prompt)
        + tokens_to_cost(writes, price_or_prompt(pricing.cache_creation_per_million))
        + tokens_to_cost(reads, price_or_prompt(pricing.cache_read_per_million))
        + tokens_to_cost(output_tokens, pricing.completion_per_million)
    )


class PriceOverrides(TypedDict, total=False):
    """ART's keywords that override single prices of a model's entry, in US dollars per
    million tokens: `extract_api_cost`, `MetricsBuilder.add_response_cost` and
    `track_api_cost` take them (None: the entry's own price)."""

    prompt_price_per_million: float | None
    completion_price_per_million: float | None
    cached_prompt_price_per_million: float | None
    cache_creation_price_per_million: float | None
    cache_read_price_per_million: float | None


def check_price_overrides(caller: str, overrides: Mapping[str, Any]) -> None:
    """A TypeError naming a keyword of `overrides` that is not a `PriceOverrides` one, as
    Python names an unexpected keyword argument of `caller`."""
    for keyword in sorted(overrides.keys() - PriceOverrides.__annotations__.keys()):
        raise TypeError(f"{caller}() got an unexpected keyword argument {keyword!r}")


def _with_overrides(base: TokenPricing, overrides: PriceOverrides) -> TokenPricing:
    # `prompt_price_per_million` overrides TokenPricing's `prompt_per_million`, and so on.
    given = cast(Mapping[str, float | None], overrides)  # every PriceOverrides value is one
    fields = {
        name.replace("_price_per_million", "_per_million"): float(value)
        for name, value in given.items()
        if value is not None
    }
    return TokenPricing(**{**base.__dict__, **fields})


def extract_api_cost(
    response: Any,
    *,
    provider: str,
    model_name: str,
    cost_extractors: Mapping[str, CostExtractor] | None = None,
    model_pricing: Mapping[str, TokenPricing] | None = None,
    **price_overrides: Unpack[PriceOverrides],
) -> float | None:
    """The US-dollar cost of `response` (see the module docstring for the order).

    The `*_price_per_million` arguments override single prices of the model's entry;
    `cost_extractors` (by provider) and `model_pricing` (by model) come before the
    shipped tables. Raises `CostUnavailableError` where nothing prices the call.
    """
    check_price_overrides("extract_api_cost", price_overrides)
    provider_name = normalize_provider(provider)
    if provider_name is None:
        raise ArtValueError("provider", "is empty", "Name the API's provider, e.g. 'openai'")
    name = normalize_model_name(model_name)
    if name is None:
        raise ArtValueError("model_name", "is empty", "Name the model, e.g. 'openai/gpt-4.1'")

    stated = _stated_cost(response)
    if stated is not None:
        return stated
    extractor = (cost_extractors or {}).get(provider_name)
    if extractor is not None:
        extracted = extractor(response)
        if extracted is not None:
            return float(extracted)

    base = (model_pricing or {}).get(name) or default_token_pricing(name)
    if base is None:
        raise CostUnavailableError(
            "model_name",
            f"no price is known for {name!r} (not in art.api_costs.MODEL_TOKEN_PRICING, "
            "LiteLLM's price list, or art.costs.MODEL_PRICING)",
            "Register one with model.metrics_builder().register_model_pricing(...), or pass "
            "prompt_price_per_million and completion_price_per_million",
        )
    pricing = _with_overrides(base, price_overrides)
    usage = _field(response, "usage")
    if provider_name == OPENAI_PROVIDER:
        cost = _openai_cost(usage, pricing)
    elif provider_name == ANTHROPIC_PROVIDER:
        cost = _anthropic_cost(usage, pricing)
    else:
        raise CostUnavailableError(
            "provider",
            f"{provider_name!r} has no cost extractor (token pricing reads 'openai' and "
            "'anthropic' usage only)",
            "Register one with model.metrics_builder().register_cost_extractor(provider, fn)",
        )
    if cost is None:
        raise CostUnavailableError(
            "response.usage",
            f"holds no {provider_name} token counts",
            "Pass the provider whose API answered, or register a cost extractor for it",
        )
    return cost


__all__ = [
    "ANTHROPIC_PROVIDER",
    "MODEL_TOKEN_PRICING",
    "OPENAI_PROVIDER",
    "CostExtractor",
    "CostUnavailableError",
    "PriceOverrides",
    "TokenPricing",
    "check_price_overrides",
    "default_token_pricing",
    "extract_api_cost",
    "load_litellm",
    "normalize_model_name",
    "normalize_provider",
]
