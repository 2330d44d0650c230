"""ART's `art.costs` import path: model prices and cost helpers (see `art.core.metrics.costs`)."""

# The implementation's names, as they are: its __all__ is this path's.
from .core.metrics.costs import *  # noqa: F403
from .core.metrics.costs import __all__ as __all__
