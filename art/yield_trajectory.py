"""ART's `art.yield_trajectory` import path."""

from typing import Any

from ._refusals import refused_name
from .integrations.capture import capture_yielded_trajectory, yield_trajectory


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = ["capture_yielded_trajectory", "yield_trajectory"]
