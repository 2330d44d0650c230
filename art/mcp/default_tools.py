"""ART's `art.mcp.default_tools` import path: the tool an agent calls when it is done."""

from ..integrations.mcp.rollout import COMPLETE_TASK_TOOL as complete_task_tool

__all__ = ["complete_task_tool"]
