"""ART's `art.utils.limit_concurrency` module path."""

from ..core.utils import limit_concurrency

__all__ = ["limit_concurrency"]
