"""ART's `art.api_costs` import path: pricing API responses and `track_api_cost` (see
`art.core.metrics.api_costs`)."""

from .core.metrics.api_costs import (
    ANTHROPIC_PROVIDER,
    MODEL_TOKEN_PRICING,
    OPENAI_PROVIDER,
    CostExtractor,
    CostUnavailableError,
    P,
    R,
    TokenPricing,
    extract_api_cost,
    normalize_model_name,
    normalize_provider,
)
from .core.metrics.cost_tracking import ResponseGetter, track_api_cost
from .core.metrics.costs import get_model_pricing, tokens_to_cost

__all__ = [
    "ANTHROPIC_PROVIDER",
    "MODEL_TOKEN_PRICING",
    "OPENAI_PROVIDER",
    "CostExtractor",
    "CostUnavailableError",
    "P",
    "R",
    "ResponseGetter",
    "TokenPricing",
    "extract_api_cost",
    "get_model_pricing",
    "normalize_model_name",
    "normalize_provider",
    "tokens_to_cost",
    "track_api_cost",
]
