"""ART's `art.dev.validate` import path."""

from typing import Any

from .._refusals import refused_name
from ..core.data.dev import is_dedicated_mode, is_external_vllm_mode, validate_dedicated_config


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = ["is_dedicated_mode", "is_external_vllm_mode", "validate_dedicated_config"]
