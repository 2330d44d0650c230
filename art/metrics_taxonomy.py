"""ART's `art.metrics_taxonomy` import path."""

# The implementation's names, as they are: its __all__ is this path's.
from .core.metrics.metrics_taxonomy import *  # noqa: F403
from .core.metrics.metrics_taxonomy import __all__ as __all__
