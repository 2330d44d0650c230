"""The LangChain chat model `init_chat_model` returns."""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.language_models import LanguageModelInput
from langchain_core.runnables import Runnable
from langchain_openai import ChatOpenAI


class ArtChatOpenAI(ChatOpenAI):
    """`ChatOpenAI` whose structured output defaults to tool calling.

    LangChain's default (`json_schema` response formats) needs constrained decoding our
    endpoint does not do; a forced tool call gives the same typed result.
    """

    def with_structured_output(
        self,
        schema: Any = None,
        *,
        method: Literal["function_calling", "json_mode", "json_schema"] = "function_calling",
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, Any]:
        return super().with_structured_output(schema, method=method, **kwargs)
