"""ART's `art.rewards.ruler` module: RULER's functions and the LiteLLM names it calls.

`ruler`, `ruler_score_group`, `TrajectoryScore`, `Response` and `DEFAULT_RUBRIC` are
`art.ruler`'s. `acompletion` (LiteLLM's), `ModelResponse` (the type RULER accepts from
it) and `ChatCompletionMessageParam` are loaded on first use, so importing this module
does not import LiteLLM. RULER's judge looks `acompletion` and `ModelResponse` up here
on every call while this module is loaded, so replacing them here (`mock.patch(
"art.rewards.ruler.acompletion", ...)`, `monkeypatch.setattr(...)`) changes what RULER
calls, as in ART.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..ruler.answer import Response, TrajectoryScore
from ..ruler.judge import ruler, ruler_score_group
from ..ruler.prompt import DEFAULT_RUBRIC

if TYPE_CHECKING:
    from litellm import acompletion as acompletion
    from litellm.types.utils import ModelResponse as ModelResponse
    from openai.types.chat.chat_completion_message_param import (
        ChatCompletionMessageParam as ChatCompletionMessageParam,
    )


def __getattr__(name: str) -> Any:
    if name == "acompletion":
        from ..core.metrics.api_costs import load_litellm

        value: Any = load_litellm().acompletion
    elif name == "ModelResponse":
        from ..core.metrics.api_costs import load_litellm

        load_litellm()
        from litellm.types.utils import ModelResponse

        value = ModelResponse
    elif name == "ChatCompletionMessageParam":
        from openai.types.chat.chat_completion_message_param import ChatCompletionMessageParam

        value = ChatCompletionMessageParam
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_RUBRIC",
    "ChatCompletionMessageParam",
    "ModelResponse",
    "Response",
    "TrajectoryScore",
    "acompletion",
    "ruler",
    "ruler_score_group",
]
