"""ART's `art.utils.litellm`: a LiteLLM choice as the OpenAI `Choice` a trajectory trains on."""

from __future__ import annotations

from typing import Any

from openai.types.chat.chat_completion import Choice
from pydantic import ValidationError

from ..core.data.errors import ArtValueError

# Fields LiteLLM adds to a choice or message that are its own bookkeeping, not the model's.
_LITELLM_ONLY = {"provider_specific_fields", "function_call", "thinking_blocks", "annotations"}


def convert_litellm_choice_to_openai(litellm_choice: Any) -> Choice:
    """The OpenAI `Choice` of a LiteLLM `Choices` (`response.choices[i]`).

    Content, tool calls, finish reason and logprobs carry over; any other field the
    endpoint sent on the choice (our endpoint's token ids) is kept as an extra.
    """
    data: dict[str, Any] = (
        litellm_choice.model_dump()
        if hasattr(litellm_choice, "model_dump")
        else dict(litellm_choice)
    )
    message = dict(data.get("message") or {})
    if message.get("role") != "assistant":
        raise ArtValueError(
            "litellm_choice.message.role",
            f"is {message.get('role')!r}; only assistant messages are choices",
            "Pass a choice from a chat completion response",
        )
    tool_calls = [
        {
            "id": call["id"],
            "type": "function",
            "function": {
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
            },
        }
        for call in message.get("tool_calls") or []
    ]
    choice = {key: value for key, value in data.items() if key not in _LITELLM_ONLY}
    choice["message"] = {
        "role": "assistant",
        "content": message.get("content"),
        **({"tool_calls": tool_calls} if tool_calls else {}),
    }
    logprobs = data.get("logprobs")
    choice["logprobs"] = (
        {"content": logprobs.get("content"), "refusal": None}
        if isinstance(logprobs, dict)
        else None
    )
    choice.setdefault("index", 0)
    choice["finish_reason"] = data.get("finish_reason") or "stop"
    try:
        return Choice.model_validate(choice)
    except ValidationError as error:
        first = error.errors()[0]
        raise ArtValueError(
            "litellm_choice." + ".".join(str(part) for part in first["loc"]),
            first["msg"],
            "Pass a choice from a chat completion response",
        ) from None


__all__ = ["convert_litellm_choice_to_openai"]
