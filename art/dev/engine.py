"""ART's `art.dev.engine` import path."""

from typing import Any

from .._refusals import refused_name
from ..core.data.dev import EngineArgs


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = ["EngineArgs"]
