"""ART's `art.langgraph.llm_wrapper` import path: its two public functions; the rest of
ART's module (its call logs and the wrapper class behind them) is refused by name."""

from typing import Any

from .._refusals import refused_name
from ..integrations.langgraph import init_chat_model, wrap_rollout


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = ["init_chat_model", "wrap_rollout"]
