"""ART's `art.types` import path."""

from .core.types import (
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
)

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
]
