"""ART's `art.utils.strip_logprobs`: a copy of nested data without its logprobs."""

from ..core.data.strip_logprobs import logger, strip_logprobs

__all__ = ["logger", "strip_logprobs"]
