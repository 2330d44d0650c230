"""Capture through LangChain's callbacks: for chat models that make their own HTTP client.

`ChatAnthropic` builds its HTTP client itself and takes none from its caller, so no
transport can be given to it. LangChain's callback handlers are its extension point for
seeing every call: given at construction (`ChatAnthropic(..., callbacks=[
art.capture_callback()])`) or per call (`config={"callbacks": [...]}`), the handler turns
each finished chat-model call made inside `with art.Trajectory() as t:` into an exchange
of `t.exchanges` in the model's protocol. The answer's fields come from what the model
class keeps of the response (`ChatAnthropic` keeps every field of Anthropic's Message,
our endpoint's sampled token ids among them, in `llm_output`), so it trains as a call
captured on the wire does. A model class whose answers keep no token ids (`ChatOpenAI`
drops them; give it `http_async_client=art.capture_http_client()` instead) is captured as
context, which the trajectory's logs say.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage
from langchain_core.outputs import LLMResult

from ...core.capture.capture_scope import current_trajectory
from ...core.capture.exchange_capture import append_exchange
from ...core.data.exchanges import MessagesExchange, utc_now

# Fields LangChain adds to what the model answered; not part of the protocol's answer.
_LANGCHAIN_KEYS = {"model_name", "model_provider"}


class CaptureCallback(AsyncCallbackHandler):
    """Records each chat-model call into the trajectory whose scope it runs in."""

    run_inline = True  # called in the caller's context, where its trajectory scope is

    def __init__(self) -> None:
        self._started: dict[UUID, tuple[datetime, dict[str, Any]]] = {}

    async def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        invocation_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if current_trajectory() is None or len(messages) != 1:
            return
        params = invocation_params or {}
        self._started[run_id] = (utc_now(), _anthropic_request(params, messages[0]))

    async def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        started = self._started.pop(run_id, None)
        trajectory = current_trajectory()
        if started is None or trajectory is None:
            return
        start_time, request = started
        message = getattr(response.generations[0][0], "message", None)
        provider = getattr(message, "response_metadata", {}).get("model_provider")
        if provider != "anthropic":
            trajectory.log(
                f"capture: a call of a LangChain chat model from {provider!r} was not captured "
                "by art.capture_callback() (it reads Anthropic's answers); give the model "
                "`http_async_client=art.capture_http_client()` where it takes one"
            )
            return
        output = dict(response.llm_output or {})
        answer = {key: value for key, value in output.items() if key not in _LANGCHAIN_KEYS}
        answer |= {
            "type": "message",
            "role": "assistant",
            "content": _content_blocks(message) if isinstance(message, AIMessage) else [],
        }
        try:
            exchange = MessagesExchange(
                start_time=start_time, end_time=utc_now(), request=request, response=answer
            )
        except ValueError as error:
            trajectory.log(f"capture: a ChatAnthropic answer could not be read: {error}")
            return
        append_exchange(trajectory, exchange)

    async def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._started.pop(run_id, None)


def capture_callback() -> CaptureCallback:
    """A LangChain callback handler that captures chat-model calls into `art.Trajectory`.

    For chat models that take no HTTP client (`ChatAnthropic(..., callbacks=[
    art.capture_callback()])`); a model that takes one captures on the wire instead.
    """
    return CaptureCallback()


def _anthropic_request(params: dict[str, Any], messages: list[BaseMessage]) -> dict[str, Any]:
    """The Messages request the model sent, rebuilt from LangChain's view of it."""
    system = [m for m in messages if isinstance(m, SystemMessage)]
    request: dict[str, Any] = {
        key: params[key]
        for key in ("model", "max_tokens", "temperature", "top_p", "stop_sequences", "tools")
        if params.get(key) is not None
    }
    if system:
        request["system"] = "\n".join(str(m.content) for m in system)
    request["messages"] = [
        _anthropic_message(m) for m in messages if not isinstance(m, SystemMessage)
    ]
    return request


def _anthropic_message(message: BaseMessage) -> dict[str, Any]:
    if isinstance(message, ToolMessage):
        result = {"type": "tool_result", "tool_use_id": message.tool_call_id}
        return {"role": "user", "content": [result | {"content": str(message.content)}]}
    if isinstance(message, AIMessage):
        return {"role": "assistant", "content": _content_blocks(message)}
    content = message.content
    return {"role": "user", "content": content if isinstance(content, str) else list(content)}


def _content_blocks(message: AIMessage) -> list[dict[str, Any]]:
    """Anthropic's content blocks of an answer: its text, then its tool calls."""
    if isinstance(message.content, list):
        blocks = [dict(b) for b in message.content if isinstance(b, dict)]
        if blocks:
            return blocks
    text = message.content if isinstance(message.content, str) else ""
    blocks = [{"type": "text", "text": text}] if text else []
    for call in message.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call["id"], "name": call["name"], "input": call["args"]}
        )
    return blocks


__all__ = ["CaptureCallback", "capture_callback"]
