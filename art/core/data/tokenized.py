"""What `art.tokenize` and `art.tensorize` return (ART 0.5.23's shapes).

A `TokenizedTrajectory` is one trajectory's conversation as the token sequence the trainer
trains on: `tokens`, the sampler's `logprobs` (NaN where unknown or not sampled) and a
`TokenFlag` per token saying what is known of it. `tensorize()` turns it into torch
tensors; torch is imported only then, so these types cost nothing to import.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntFlag
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, model_validator

from .errors import TrajectoryValidationError
from .trajectories import History, MetadataValue, MetricValue, Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    import torch

Device = Any  # torch.device | str | None, kept loose so that no torch is imported here


class TokenFlag(IntFlag):
    """Facts about one token; combined as bits (ART's values)."""

    EXACT = 1 << 0  # the id is the server's own (prompt or sampled), not a re-encoding
    SAMPLED = 1 << 1  # the model sampled it (implies EXACT and OUTPUT)
    ASSISTANT = 1 << 2  # it lies in an assistant turn
    STOP = 1 << 3  # it ended a generation (not set here: the stop is inside the sampled ids)
    OUTPUT = 1 << 4  # it came from a response
    RAW_LOGPROBS = 1 << 5  # ART's provenance bits for logprobs; not set here
    PROCESSED_LOGPROBS = 1 << 6


class TokenizedHistory(BaseModel):
    """One conversation as a token sequence: ids, sampler logprobs and flags, aligned."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    history: History
    model: str
    tokens: list[int]
    logprobs: list[float]
    flags: list[TokenFlag]

    @model_validator(mode="after")
    def _same_lengths(self) -> TokenizedHistory:
        if not len(self.tokens) == len(self.logprobs) == len(self.flags):
            raise TrajectoryValidationError(
                "tokens",
                f"{len(self.tokens)} tokens, {len(self.logprobs)} logprobs and "
                f"{len(self.flags)} flags",
                "Give one logprob and one flag per token",
            )
        return self

    def tensorize(self, *, device: Device = None) -> TensorizedHistory:
        """The same history as tensors (int64 tokens, float32 logprobs, int32 flags)."""
        tokens, logprobs, flags = _tensors(self, device)
        return TensorizedHistory(self.history, self.model, tokens, logprobs, flags)


class TokenizedTrajectory(TokenizedHistory):
    """A trajectory's one conversation, tokenized; its reward and metrics are the
    trajectory's own (setting them sets the trajectory's)."""

    trajectory: Trajectory

    @property
    def reward(self) -> float:
        return self.trajectory.reward

    @reward.setter
    def reward(self, value: float) -> None:
        self.trajectory.reward = value

    @property
    def metrics(self) -> dict[str, MetricValue]:
        return self.trajectory.metrics

    @property
    def metadata(self) -> dict[str, MetadataValue]:
        return self.trajectory.metadata

    def tensorize(self, *, device: Device = None) -> TensorizedTrajectory:
        tokens, logprobs, flags = _tensors(self, device)
        return TensorizedTrajectory(
            self.history, self.model, tokens, logprobs, flags, trajectory=self.trajectory
        )


class TokenizedTrajectoryGroup(BaseModel):
    """A group's trajectories, tokenized, in the group's order."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    trajectory_group: TrajectoryGroup
    trajectories: list[TokenizedTrajectory]

    @property
    def metrics(self) -> dict[str, MetricValue]:
        return self.trajectory_group.metrics

    @property
    def metadata(self) -> dict[str, MetadataValue]:
        return self.trajectory_group.metadata

    def tensorize(self, *, device: Device = None) -> TensorizedTrajectoryGroup:
        return TensorizedTrajectoryGroup(
            self.trajectory_group, [t.tensorize(device=device) for t in self.trajectories]
        )


@dataclass
class TensorizedHistory:
    """A tokenized history as one-dimensional tensors on `device`."""

    history: History
    model: str
    tokens: torch.Tensor
    logprobs: torch.Tensor
    flags: torch.Tensor


@dataclass
class TensorizedTrajectory(TensorizedHistory):
    trajectory: Trajectory

    @property
    def reward(self) -> float:
        return self.trajectory.reward


@dataclass
class TensorizedTrajectoryGroup:
    trajectory_group: TrajectoryGroup
    trajectories: list[TensorizedTrajectory]


def _tensors(
    history: TokenizedHistory, device: Device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    import torch

    where = device or "cpu"
    return (
        torch.tensor(history.tokens, dtype=torch.int64, device=where),
        torch.tensor(history.logprobs, dtype=torch.float32, device=where),
        torch.tensor([int(flag) for flag in history.flags], dtype=torch.int32, device=where),
    )


__all__ = [
    "TensorizedHistory",
    "TensorizedTrajectory",
    "TensorizedTrajectoryGroup",
    "TokenFlag",
    "TokenizedHistory",
    "TokenizedTrajectory",
    "TokenizedTrajectoryGroup",
]
