"""Score and train agents that use MCP tool servers."""

from ...core.not_built import not_built_class, not_built_function

_MISSING = "the MCP integration (tool discovery, rollouts, scenario generation) is not built yet"

MCPTool = not_built_class("MCPTool", _MISSING)
MCPResource = not_built_class("MCPResource", _MISSING)
GeneratedScenario = not_built_class("GeneratedScenario", _MISSING)
GeneratedScenarioCollection = not_built_class("GeneratedScenarioCollection", _MISSING)
generate_scenarios = not_built_function("generate_scenarios", _MISSING)

__all__ = [
    "GeneratedScenario",
    "GeneratedScenarioCollection",
    "MCPResource",
    "MCPTool",
    "generate_scenarios",
]
