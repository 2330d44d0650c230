"""Train the model behind an existing LangGraph agent."""

from ...core.not_built import not_built_function

_MISSING = "the LangGraph integration (recording a graph's LLM calls) is not built yet"

init_chat_model = not_built_function("init_chat_model", _MISSING)
wrap_rollout = not_built_function("wrap_rollout", _MISSING)

__all__ = ["init_chat_model", "wrap_rollout"]
