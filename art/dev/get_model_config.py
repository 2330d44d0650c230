"""ART's `art.dev.get_model_config` import path."""

from typing import Any

from .._refusals import refused_name
from ..core.data.not_built import not_built_function

get_model_config = not_built_function(
    "art.dev.get_model_config",
    "defaults are the fields of InternalModelConfig(); read model.internal_config",
)


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = ["get_model_config"]
