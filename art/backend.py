"""ART's `art.backend` import path."""

from .core.backend import Backend, InferenceEndpoint

__all__ = ["Backend", "InferenceEndpoint"]
