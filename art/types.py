"""ART's `art.types` import path."""

from typing import Any

from ._refusals import refused_name
from .core.data.types import (
    LocalTrainResult,
    Message,
    MessageOrChoice,
    Messages,
    MessagesAndChoices,
    ServerlessTrainResult,
    Tool,
    Tools,
    TrainConfig,
    TrainResult,
    TrainSFTConfig,
    Verbosity,
)


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = [
    "LocalTrainResult",
    "Message",
    "MessageOrChoice",
    "Messages",
    "MessagesAndChoices",
    "ServerlessTrainResult",
    "Tool",
    "Tools",
    "TrainConfig",
    "TrainResult",
    "TrainSFTConfig",
    "Verbosity",
]
