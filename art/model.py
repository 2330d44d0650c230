"""ART's `art.model` import path."""

from .core.model import Model, TrainableModel

__all__ = ["Model", "TrainableModel"]
