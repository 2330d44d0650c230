"""ART's `art.mcp` import path."""

from .integrations.mcp import (
    GeneratedScenario,
    GeneratedScenarioCollection,
    MCPResource,
    MCPTool,
    generate_scenarios,
)

__all__ = [
    "GeneratedScenario",
    "GeneratedScenarioCollection",
    "MCPResource",
    "MCPTool",
    "generate_scenarios",
]
