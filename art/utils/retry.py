"""ART's `art.utils.retry` module path."""

from ..core.utils import retry

__all__ = ["retry"]
