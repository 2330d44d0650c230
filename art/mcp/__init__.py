"""ART's `art.mcp` import path: the same names as `art.integrations.mcp`, with ART's
submodules `art.mcp.types`, `.generate_scenarios` and `.default_tools`."""

from ..integrations.mcp import *  # noqa: F403
from ..integrations.mcp import __all__ as _integration_names

# Imported from the submodules (as ART does), so the package's `generate_scenarios` stays
# the function once `art.mcp.generate_scenarios`, the module, has been imported.
from .default_tools import complete_task_tool
from .generate_scenarios import generate_scenarios as generate_scenarios

__all__ = [*_integration_names, "complete_task_tool"]
