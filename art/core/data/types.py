"""Message types and the user-facing training config.

`Message` and `Tool` are the OpenAI SDK's own request types, so messages written for
the OpenAI client type-check here unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_param import ChatCompletionMessageParam
from openai.types.chat.chat_completion_tool_param import ChatCompletionToolParam
from pydantic import ConfigDict, Field, field_validator

from .config_errors import ConfigModel

MetadataValue: TypeAlias = float | int | str | bool | None
"""A value of `Trajectory.metadata` or a group's metadata: a scalar the Parquet log can store."""
MetricValue: TypeAlias = float | int | bool
"""A value of `Trajectory.metrics` or a group's metrics."""
Message: TypeAlias = ChatCompletionMessageParam
"""A chat message as the OpenAI client takes it (a dict with `role` and `content`): context."""
MessageOrChoice: TypeAlias = Message | Choice
"""A plain message (context) or an OpenAI `Choice` the model sampled (a trained turn)."""
Messages: TypeAlias = list[Message]
"""A conversation of plain messages, as `Trajectory.messages()` returns it."""
MessagesAndChoices: TypeAlias = list[MessageOrChoice]
"""A trajectory's conversation: plain messages and the sampled `Choice`s, in order."""
Tool: TypeAlias = ChatCompletionToolParam
"""A tool schema as the OpenAI client takes it (`{"type": "function", "function": {...}}`)."""
Tools: TypeAlias = list[Tool]
"""The tools the model was offered in a rollout."""
Verbosity: TypeAlias = Literal[0, 1, 2]
"""How much a training call prints: ART's `verbose` levels (0 quiet)."""


class TrainConfig(ConfigModel):
    """Settings of one `model.train(...)` call."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    learning_rate: float = Field(default=5e-6, gt=0, description="Optimizer step size.")
    beta: float = Field(
        default=0.0,
        ge=0,
        description="Weight of the KL penalty towards the base model; 0 turns it off.",
    )
    kl_penalty_coef: float = Field(
        default=0.0,
        ge=0,
        description="ART's KL-penalised advantage: each token's advantage rises by this "
        "times (the micro-batch's mean log-ratio to the base model minus the token's own), "
        "so tokens that moved furthest from the base are held back. 0 turns it off.",
    )
    grad_accumulation_sequences: int | None = Field(
        default=None,
        ge=1,
        description="ART's name for `art.dev.TrainConfig.gradient_accumulation_sequences`: "
        "most sequences in one forward/backward pass; None: as many as the memory plan fits.",
    )
    kl_penalty_source: Literal["current_learner", "sample"] = Field(
        default="current_learner",
        description="Whose log-probabilities the kl_penalty_coef advantage compares with the "
        "base model's (ART 0.5.23's): the policy being trained, or the sampler's (the "
        "tokens' logprobs as the rollout drew them).",
    )
    optimizer_save_interval: int = Field(
        default=1,
        ge=1,
        description="Keep the optimizer state (`optimizer.pt`) in every Nth checkpoint, and "
        "in checkpoints 1 and final_training_step onwards (ART 0.5.23's rule); the others "
        "hold the adapter only, and a run resumed from one starts AdamW's moments afresh. "
        "1 (ours; ART's default is 5): in every checkpoint.",
    )
    final_training_step: int | None = Field(
        default=None,
        ge=1,
        description="The run's last step (ART 0.5.23's): from it on every checkpoint keeps "
        "the optimizer state, whatever optimizer_save_interval says. None: not known.",
    )

    def keeps_optimizer_state(self, step: int) -> bool:
        """Whether checkpoint `step` keeps the optimizer state (optimizer_save_interval)."""
        interval, final = self.optimizer_save_interval, self.final_training_step
        return (
            interval == 1
            or step <= 1
            or step % interval == 0
            or (final is not None and step >= final)
        )


class TrainSFTConfig(ConfigModel):
    """Settings of one `model.train_sft(...)` call (ART's names and defaults).

    `learning_rate` is one rate for every batch, or a list holding one rate per batch
    (`art.utils.sft.train_sft_from_file` passes its schedule so). `batch_size` is the
    trajectories per optimizer step; "auto" is 2, as in ART's LocalBackend.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    learning_rate: float | list[float] = Field(
        default=5e-5, description="One rate for every batch, or one per batch."
    )
    batch_size: int | Literal["auto"] = Field(
        default="auto", description="Trajectories per optimizer step; 'auto' is 2."
    )
    assistant_turns: Literal["all", "last"] = Field(
        default="all",
        description="Which assistant turns the loss trains (ART 0.5.23's): every one, or "
        "only the final message, which must then be the assistant's (the earlier turns "
        "are context).",
    )

    @field_validator("learning_rate")
    @classmethod
    def _positive_rates(cls, value: float | list[float]) -> float | list[float]:
        rates = value if isinstance(value, list) else [value]
        if not rates:
            raise ValueError("the list of learning rates is empty; give one rate per batch")
        if any(not rate >= 0 for rate in rates):  # also catches NaN
            raise ValueError("learning rates must be >= 0")
        return value

    @field_validator("batch_size")
    @classmethod
    def _positive_batch(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("batch_size must be >= 1 (or 'auto')")
        return value

    def resolved_batch_size(self) -> int:
        """The batch size, with "auto" resolved."""
        return 2 if self.batch_size == "auto" else self.batch_size


@dataclass
class TrainResult:
    """What `backend.train(...)` returns: the step after training and its metrics."""

    step: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class LocalTrainResult(TrainResult):
    """`LocalBackend.train`'s result; `checkpoint_path` is the new step's checkpoint
    directory (None when `save_checkpoint=False` asked not to report it)."""

    checkpoint_path: str | None = None


@dataclass
class ServerlessTrainResult(TrainResult):
    """`ServerlessBackend.train`'s result; `artifact_name` is W&B's
    `entity/project/name:step{N}` when the model has an entity, else None."""

    artifact_name: str | None = None


__all__ = [
    "Choice",
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
