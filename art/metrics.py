"""ART's `art.metrics` import path: `MetricsBuilder` and `track_api_cost` (see
`art.core.metrics.metrics_builder` and `art.core.metrics.cost_tracking`)."""

from .core.metrics.api_costs import (
    CostExtractor,
    TokenPricing,
    extract_api_cost,
    normalize_model_name,
    normalize_provider,
)
from .core.metrics.cost_tracking import track_api_cost
from .core.metrics.metrics_builder import (
    PIPELINE_RL_DASHBOARD_DEFAULT_METRICS,
    PIPELINE_RL_METRIC_DEFINITIONS,
    PIPELINE_RL_SCORE_METRICS,
    MetricDefinition,
    MetricsBuilder,
    is_builder_managed_metric,
    is_cumulative_metric_key,
    to_cumulative_metric_key,
)

__all__ = [
    "PIPELINE_RL_DASHBOARD_DEFAULT_METRICS",
    "PIPELINE_RL_METRIC_DEFINITIONS",
    "PIPELINE_RL_SCORE_METRICS",
    "CostExtractor",
    "MetricDefinition",
    "MetricsBuilder",
    "TokenPricing",
    "extract_api_cost",
    "is_builder_managed_metric",
    "is_cumulative_metric_key",
    "normalize_model_name",
    "normalize_provider",
    "to_cumulative_metric_key",
    "track_api_cost",
]
