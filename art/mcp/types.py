"""ART's `art.mcp.types` import path."""

from ..integrations.mcp.types import (
    GeneratedScenario,
    GeneratedScenarioCollection,
    MCPResource,
    MCPTool,
)

__all__ = ["GeneratedScenario", "GeneratedScenarioCollection", "MCPResource", "MCPTool"]
