"""ART's `art.model` import path."""

from typing import Any

from ._refusals import refused_name
from .core.model import Model, TrainableModel


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = ["Model", "TrainableModel"]
