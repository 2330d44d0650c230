"""ART's `art.costs` import path: model prices and cost helpers (see `art.core.costs`)."""

from .core.costs import (
    MODEL_PRICING,
    CostCalculator,
    ModelPricing,
    TokenCount,
    build_cost_calculator,
    compute_sample_costs,
    compute_train_cost,
    get_model_pricing,
    tokens_to_cost,
)

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
