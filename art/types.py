"""ART's `art.types` import path."""

from .core.types import (
    Message,
    MessageOrChoice,
    Messages,
    MessagesAndChoices,
    Tool,
    Tools,
    TrainConfig,
)

__all__ = [
    "Message",
    "MessageOrChoice",
    "Messages",
    "MessagesAndChoices",
    "Tool",
    "Tools",
    "TrainConfig",
]
