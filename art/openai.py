"""ART's `art.openai` import path: a streamed chat completion read into a whole one."""

from typing import Any

from ._refusals import refused_name
from .integrations.capture.streams import (
    IncompleteChatCompletionStreamError,
    consume_chat_completion_stream,
    consume_sync_chat_completion_stream,
    finalize_chat_completion,
    init_chat_completion,
    update_chat_completion,
)


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = [
    "IncompleteChatCompletionStreamError",
    "consume_chat_completion_stream",
    "consume_sync_chat_completion_stream",
    "finalize_chat_completion",
    "init_chat_completion",
    "update_chat_completion",
]
