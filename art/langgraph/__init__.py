"""ART's `art.langgraph` import path (and its submodule `art.langgraph.llm_wrapper`)."""

from ..integrations.langgraph import init_chat_model, wrap_rollout

__all__ = ["init_chat_model", "wrap_rollout"]
