"""Per-token prices of hosted training and inference, and what a call or a step costs.

ART's `art.costs`: `ModelPricing` gives a model's price in US dollars per million tokens
for prefill (the prompt), sampling (the completion) and training; `MODEL_PRICING` holds
the prices ART ships for the models its hosted service runs. Cost metrics are named
`costs/<context>/<source>` (`costs/train/tinker_prefill`), the names `MetricsBuilder`
(`art.metrics`) rolls up into `costs/<context>`, `costs/all` and their `costs/cum/...`
running totals in `history.jsonl`.

A model served by this library's own backends (LocalBackend's endpoint) has no price
here: its calls are unpriced, and record no cost, unless you give it one
(`MetricsBuilder.register_model_pricing`, or an entry in `MODEL_PRICING`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from ..data.errors import ArtValueError


@dataclass(frozen=True)
class ModelPricing:
    """US dollars per million tokens: `prefill` (prompt), `sample` (completion), `train`."""

    prefill: float
    sample: float
    train: float


TokenCount: TypeAlias = int | None
CostCalculator: TypeAlias = Callable[[TokenCount, TokenCount, str], dict[str, float]]


def _pricing(prefill: float, sample: float, train: float) -> ModelPricing:
    return ModelPricing(prefill=prefill, sample=sample, train=train)


# The list prices ART 0.5.23 ships for its hosted models ($ per 1M tokens: prefill,
# sample, train). A `:peft:<context>` suffix is the long-context LoRA offering.
MODEL_PRICING: dict[str, ModelPricing] = {
    "Qwen/Qwen3.6-35B-A3B": _pricing(0.36, 0.89, 1.07),
    "Qwen/Qwen3.6-27B": _pricing(1.24, 3.73, 3.73),
    "Qwen/Qwen3.5-4B": _pricing(0.22, 0.67, 0.67),
    "Qwen/Qwen3.5-27B": _pricing(1.24, 3.73, 3.73),
    "Qwen/Qwen3.5-35B-A3B": _pricing(0.36, 0.89, 1.07),
    "Qwen/Qwen3.5-397B-A17B": _pricing(2.00, 5.00, 6.00),
    "Qwen/Qwen3.5-397B-A17B:peft:262144": _pricing(4.00, 10.00, 12.00),
    "Qwen/Qwen3-4B-Instruct-2507": _pricing(0.07, 0.22, 0.22),
    "Qwen/Qwen3-8B": _pricing(0.13, 0.40, 0.40),
    "Qwen/Qwen3-8B-Base": _pricing(0.13, 0.40, 0.40),
    "Qwen/Qwen3-30B-A3B": _pricing(0.12, 0.30, 0.36),
    "Qwen/Qwen3-30B-A3B-Base": _pricing(0.12, 0.30, 0.36),
    "Qwen/Qwen3-30B-A3B-Instruct-2507": _pricing(0.12, 0.30, 0.36),
    "Qwen/Qwen3-32B": _pricing(0.49, 1.47, 1.47),
    "Qwen/Qwen3-235B-A22B-Instruct-2507": _pricing(0.68, 1.70, 2.04),
    "Qwen/Qwen3-VL-30B-A3B-Instruct": _pricing(0.18, 0.44, 0.53),
    "Qwen/Qwen3-VL-235B-A22B-Instruct": _pricing(1.02, 2.56, 3.07),
    "meta-llama/Llama-3.2-1B": _pricing(0.03, 0.09, 0.09),
    "meta-llama/Llama-3.2-3B": _pricing(0.06, 0.18, 0.18),
    "meta-llama/Llama-3.1-8B": _pricing(0.13, 0.40, 0.40),
    "meta-llama/Llama-3.1-8B-Instruct": _pricing(0.13, 0.40, 0.40),
    "meta-llama/Llama-3.1-70B": _pricing(1.05, 3.16, 3.16),
    "meta-llama/Llama-3.3-70B-Instruct": _pricing(1.05, 3.16, 3.16),
    "deepseek-ai/DeepSeek-V3.1": _pricing(1.13, 2.81, 3.38),
    "deepseek-ai/DeepSeek-V3.1-Base": _pricing(1.13, 2.81, 3.38),
    "openai/gpt-oss-120b": _pricing(0.18, 0.44, 0.52),
    "openai/gpt-oss-120b:peft:131072": _pricing(0.63, 1.54, 1.82),
    "openai/gpt-oss-20b": _pricing(0.12, 0.30, 0.36),
    "moonshotai/Kimi-K2-Thinking": _pricing(0.98, 2.44, 2.93),
    "moonshotai/Kimi-K2.5": _pricing(1.47, 3.66, 4.40),
    "moonshotai/Kimi-K2.5:peft:131072": _pricing(5.15, 12.81, 15.40),
    "moonshotai/Kimi-K2.6": _pricing(1.47, 3.66, 4.40),
    "moonshotai/Kimi-K2.6:peft:131072": _pricing(5.15, 12.81, 15.40),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": _pricing(0.13, 0.33, 0.40),
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16": _pricing(0.38, 0.96, 1.16),
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16:peft:262144": _pricing(0.76, 1.92, 2.32),
}


def get_model_pricing(model_name: str | None, *, strict: bool = False) -> ModelPricing | None:
    """`model_name`'s entry in `MODEL_PRICING`; None when it has none (an error if `strict`)."""
    if model_name is None:
        return None
    pricing = MODEL_PRICING.get(model_name)
    if pricing is None and strict:
        raise ArtValueError(
            "model_name",
            f"{model_name!r} has no price in art.costs.MODEL_PRICING",
            f"Add one (art.costs.MODEL_PRICING[{model_name!r}] = art.costs.ModelPricing(...)) "
            f"or use a priced model: {sorted(MODEL_PRICING)}",
        )
    return pricing


def tokens_to_cost(num_tokens: float, price_per_million: float) -> float:
    """US dollars for `num_tokens` at `price_per_million` dollars per million tokens."""
    return float(num_tokens) * price_per_million / 1_000_000


def _context(cost_context: str) -> str:
    normalized = cost_context.strip("/")
    if not normalized:
        raise ArtValueError(
            "cost_context", "is empty", "Name where the cost arose, e.g. 'train' or 'eval'"
        )
    return normalized


def compute_sample_costs(
    *,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    cost_context: str,
    pricing: ModelPricing,
) -> dict[str, float]:
    """The prefill and sampling cost of one inference call, as ART's cost metrics:
    `costs/<cost_context>/tinker_prefill` and `costs/<cost_context>/tinker_sample`."""
    context = _context(cost_context)
    return {
        f"costs/{context}/tinker_prefill": tokens_to_cost(prompt_tokens or 0, pricing.prefill),
        f"costs/{context}/tinker_sample": tokens_to_cost(completion_tokens or 0, pricing.sample),
    }


def build_cost_calculator(pricing: ModelPricing) -> CostCalculator:
    """`compute_sample_costs` with `pricing` fixed: `(prompt, completion, context) -> metrics`."""

    def calculate(
        prompt_tokens: TokenCount, completion_tokens: TokenCount, cost_context: str
    ) -> dict[str, float]:
        return compute_sample_costs(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_context=cost_context,
            pricing=pricing,
        )

    return calculate


def compute_train_cost(train_tokens: float, pricing: ModelPricing) -> float:
    """US dollars for training on `train_tokens` tokens."""
    return tokens_to_cost(train_tokens, pricing.train)


__all__ = [
    "MODEL_PRICING",
    "CostCalculator",
    "ModelPricing",
    "TokenCount",
    "build_cost_calculator",
    "compute_sample_costs",
    "compute_train_cost",
    "get_model_pricing",
    "tokens_to_cost",
]
