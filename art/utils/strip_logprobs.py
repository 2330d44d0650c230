"""ART's `art.utils.strip_logprobs`: a copy of nested data without its logprobs."""

from ..core.strip_logprobs import logger, strip_logprobs

__all__ = ["logger", "strip_logprobs"]
