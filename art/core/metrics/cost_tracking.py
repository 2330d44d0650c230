"""Recording what hosted-API calls cost into the active `MetricsBuilder`: `record_api_cost`
for one response, `track_api_cost` for every call of a function (ART's `art.metrics`).

Each cost is priced by `art.core.metrics.api_costs` and recorded as `costs/<context>/<source>` in
the builder a model activated (`model.activate_metrics_context("train")`); outside an
active context nothing is recorded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import wraps
from inspect import iscoroutinefunction
from typing import Any, Unpack, cast

from ..data.errors import ArtValueError
from .api_costs import (
    P,
    PriceOverrides,
    R,
    check_price_overrides,
    normalize_model_name,
    normalize_provider,
)
from .metrics_builder import MetricsBuilder

ResponseGetter = Callable[[Any], Any]
"""Picks the API response out of what a `track_api_cost` function returns."""


def record_api_cost(
    source: str,
    response: Any,
    *,
    provider: str,
    model_name: str,
    **price_overrides: float | None,
) -> float | None:
    """Record `response`'s cost as `costs/<context>/<source>` in the active
    `MetricsBuilder`, if one is active, and return it (None where nothing is active).

    Raises `CostUnavailableError` where the call cannot be priced.
    """
    try:
        builder = MetricsBuilder.get_active()
    except LookupError:
        return None
    return builder.add_response_cost(
        source, response, provider=provider, model_name=model_name, **price_overrides
    )


def track_api_cost(
    *,
    source: str,
    provider: str,
    model_name: str,
    response_getter: ResponseGetter | None = None,
    **price_overrides: Unpack[PriceOverrides],
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function (sync or async) that calls an API, so that each response's cost
    is recorded as `costs/<context>/<source>` in the active `MetricsBuilder`.

    `response_getter` picks the response out of the function's result (default: the
    result). Outside an active metrics context nothing is recorded; inside one, a
    response nothing can price raises `CostUnavailableError` after the call.
    """
    check_price_overrides("track_api_cost", price_overrides)
    normalized_source = source.strip("/")
    if not normalized_source:
        raise ArtValueError("source", "is empty", "Name the cost's source, e.g. 'judge/ruler'")
    provider_name = normalize_provider(provider)
    if provider_name is None:
        raise ArtValueError("provider", "is empty", "Name the API's provider, e.g. 'openai'")
    name = normalize_model_name(model_name)
    if name is None:
        raise ArtValueError("model_name", "is empty", "Name the model, e.g. 'openai/gpt-4.1'")

    def record(result: Any) -> None:
        response = response_getter(result) if response_getter is not None else result
        record_api_cost(
            normalized_source, response, provider=provider_name, model_name=name, **price_overrides
        )

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        if iscoroutinefunction(func):
            coroutine_function = cast(Callable[P, Awaitable[Any]], func)

            @wraps(func)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                result = await coroutine_function(*args, **kwargs)
                record(result)
                return result

            return cast(Callable[P, R], async_wrapper)

        @wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            result = func(*args, **kwargs)
            record(result)
            return result

        return wrapper

    return decorate


__all__ = ["ResponseGetter", "record_api_cost", "track_api_cost"]
