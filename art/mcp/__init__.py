"""ART's `art.mcp` import path: the same names as `art.integrations.mcp`."""

from .integrations.mcp import *  # noqa: F403
from .integrations.mcp import __all__ as __all__
