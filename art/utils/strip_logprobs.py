"""ART's `art.utils.strip_logprobs`: a copy of nested data without its logprobs."""

from ..core.strip_logprobs import strip_logprobs

__all__ = ["strip_logprobs"]
