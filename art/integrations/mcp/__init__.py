"""Score and train agents that use MCP tool servers.

    async with MCPSession.stdio(sys.executable, ["server.py"]) as session:
        tools = await session.list_tools()
        scenarios = await generate_scenarios(tools, num_scenarios=16, generator_model=model)
        trajectory = await mcp_rollout(model, scenarios[0], session)

Importing this package imports neither `mcp` nor LiteLLM; they load on first use.
"""

from .generate import ScenarioGenerationError, generate_scenarios
from .rollout import COMPLETE_TASK, MCPRolloutConfig, mcp_rollout
from .scoring import (
    MCPEvaluation,
    RewardFn,
    ScenarioResult,
    Scorer,
    evaluate,
    reward_scorer,
    ruler_scorer,
)
from .session import MCPConnectionError, MCPSession, ToolResult
from .types import GeneratedScenario, GeneratedScenarioCollection, MCPResource, MCPTool

__all__ = [
    "COMPLETE_TASK",
    "GeneratedScenario",
    "GeneratedScenarioCollection",
    "MCPConnectionError",
    "MCPEvaluation",
    "MCPResource",
    "MCPRolloutConfig",
    "MCPSession",
    "MCPTool",
    "RewardFn",
    "ScenarioGenerationError",
    "ScenarioResult",
    "Scorer",
    "ToolResult",
    "evaluate",
    "generate_scenarios",
    "mcp_rollout",
    "reward_scorer",
    "ruler_scorer",
]
