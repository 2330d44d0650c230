"""ART's `art.tokenizer` import path: `get_tokenizer(base_model, *, revision=None, **kwargs)`."""

from .runtime.tokenizer import get_tokenizer

__all__ = ["get_tokenizer"]
