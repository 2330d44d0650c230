"""ART's `art.trajectories` import path."""

from typing import Any

from .._refusals import refused_name
from ..core.capture.capture_scope import (
    current_trajectory,
    no_capture,
    trajectory,
    trajectory_group,
)
from ..core.data.exchanges import (
    ChatCompletionsExchange,
    CompletionsExchange,
    MessagesExchange,
    ResponsesExchange,
    TrajectoryExchanges,
)
from ..core.data.tokenized import (
    TensorizedHistory,
    TensorizedTrajectory,
    TensorizedTrajectoryGroup,
    TokenFlag,
    TokenizedHistory,
    TokenizedTrajectory,
    TokenizedTrajectoryGroup,
)
from ..core.data.trajectories import (
    History,
    MetadataValue,
    PydanticException,
    Trajectory,
    TrajectoryGroup,
)
from ..core.data.trajectories import messages_of as get_messages


def __getattr__(name: str) -> Any:
    if name in ("tokenize", "tensorize"):  # the model service's tokenization: loaded on use
        from ..runtime import art_tokenize

        return getattr(art_tokenize, name)
    return refused_name(__name__, name)


__all__ = [
    "ChatCompletionsExchange",
    "CompletionsExchange",
    "History",
    "MessagesExchange",
    "MetadataValue",
    "PydanticException",
    "ResponsesExchange",
    "TensorizedHistory",
    "TensorizedTrajectory",
    "TensorizedTrajectoryGroup",
    "TokenFlag",
    "TokenizedHistory",
    "TokenizedTrajectory",
    "TokenizedTrajectoryGroup",
    "Trajectory",
    "TrajectoryExchanges",
    "TrajectoryGroup",
    "current_trajectory",
    "get_messages",
    "no_capture",
    "tensorize",
    "tokenize",
    "trajectory",
    "trajectory_group",
]
