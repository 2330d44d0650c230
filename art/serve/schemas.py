"""Request bodies of `art serve`'s training API (the W&B Training API, plus a few fields).

Field names and shapes follow the managed service's API as ART's published client
sends it. Fields marked "extension" are ours: the managed service does not have them.
Every body forbids unknown fields, so a typo is a 400 naming it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..core.data import dev
from ..core.data.errors import ConfigError
from ..core.data.types import TrainConfig
from ..runtime.endpoint.server import ApiError

MAX_STEP = 2**31 - 1  # a step names files and directories: far beyond any run's
MAX_SFT_BATCH = 4096  # examples in one optimizer step; an upload's size is bounded too
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"  # as art.Model names: safe as directories


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelCreate(_Body):
    entity: str | None = Field(default=None, pattern=NAME_PATTERN)
    project: str = Field(pattern=NAME_PATTERN)
    name: str = Field(pattern=NAME_PATTERN)
    base_model: str | None = Field(default=None, min_length=1)
    return_existing: bool = False
    # Extensions: plain (logging-only) models, the user's config, and how the model is
    # loaded, served and trained (honoured, or refused naming the field).
    trainable: bool = True
    config: Any = None
    internal_config: dev.InternalModelConfig | None = None


class LogRequest(_Body):
    model_id: str | None = None  # ART's client repeats the path's id here
    split: str = "train"
    trajectory_groups: list[dict[str, Any]] = Field(default_factory=list)
    # Extensions: the step the row belongs to, and a history row of metrics.
    step: int | None = Field(default=None, ge=0, le=MAX_STEP)
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)


class DeleteCheckpoints(_Body):
    steps: list[int]


class ForkCheckpoint(_Body):
    """ART's `_experimental_fork_checkpoint`: start a model from another's checkpoint."""

    from_model: str = Field(pattern=NAME_PATTERN)
    from_project: str | None = Field(default=None, pattern=NAME_PATTERN)
    not_after_step: int | None = None


class ExperimentalTrainingConfig(_Body):
    """ART's training settings. ART's fields we cannot honour are refused when set."""

    learning_rate: float | None = None
    scale_rewards: bool | None = None
    ppo: bool | None = None
    epsilon: float | None = None
    epsilon_high: float | None = None
    importance_sampling_level: (
        Literal["token", "sequence", "average", "geometric_average"] | None
    ) = None
    allow_training_without_logprobs: bool | None = None
    kimi_k2_tau: float | None = None
    mask_prob_ratio: bool | None = None
    max_negative_advantage_importance_sampling_weight: float | None = None
    advantage_balance: float | None = None
    precalculate_logprobs: bool | None = None
    # Extensions: our TrainConfig.beta (a KL term towards the base model) and
    # kl_penalty_coef (ART's LocalBackend keyword; its managed API has no field for it),
    # and our dev.TrainConfig fields that ART's LocalBackend.train takes as keywords.
    beta: float | None = None
    kl_penalty_coef: float | None = None
    kl_penalty_source: Literal["current_learner", "sample"] | None = None  # ART's API has it
    optimizer_save_interval: int | None = None
    final_training_step: int | None = None
    max_grad_norm: float | None = None
    gradient_accumulation_sequences: int | None = None
    truncated_importance_sampling: float | None = None
    num_trajectories_learning_rate_multiplier_power: float | None = None
    packed_sequence_length: int | None = None
    logprob_calculation_chunk_size: int | None = None

    def to_configs(self) -> tuple[TrainConfig, dev.TrainConfig]:
        """Our two training configs; a 400 naming `experimental_config.<field>` if invalid."""
        top = {
            "learning_rate": self.learning_rate,
            "beta": self.beta,
            "kl_penalty_coef": self.kl_penalty_coef,
            "kl_penalty_source": self.kl_penalty_source,
            "optimizer_save_interval": self.optimizer_save_interval,
            "final_training_step": self.final_training_step,
        }
        rest = {
            name: getattr(self, name)
            for name in (
                "scale_rewards",
                "ppo",
                "epsilon",
                "epsilon_high",
                "importance_sampling_level",
                "allow_training_without_logprobs",
                "kimi_k2_tau",
                "mask_prob_ratio",
                "max_negative_advantage_importance_sampling_weight",
                "max_grad_norm",
                "gradient_accumulation_sequences",
                "advantage_balance",
                "precalculate_logprobs",
                "truncated_importance_sampling",
                "num_trajectories_learning_rate_multiplier_power",
                "packed_sequence_length",
                "logprob_calculation_chunk_size",
            )
        }
        try:
            config = TrainConfig(**{k: v for k, v in top.items() if v is not None})
        except ConfigError as error:
            raise _config_error(error) from error
        try:
            dev_config = dev.TrainConfig(**{k: v for k, v in rest.items() if v is not None})
        except ConfigError as error:
            raise _config_error(error) from error
        return config, dev_config


def _config_error(error: ConfigError) -> ApiError:
    param = f"experimental_config.{error.field}"
    return ApiError(400, f"{param}: {error.problem}. {error.fix}", param=param)


class TrainingJobCreate(_Body):
    model_id: str
    trajectory_groups: list[dict[str, Any]] = Field(min_length=1)
    experimental_config: ExperimentalTrainingConfig | None = None


class SFTConfig(_Body):
    """ART's `SFTTrainingConfig`: one learning rate or one per batch; the batch size
    (None: 2, as `TrainSFTConfig(batch_size="auto")`)."""

    batch_size: int | None = Field(default=None, ge=1, le=MAX_SFT_BATCH)
    learning_rate: float | list[float] | None = None


class SFTTrainingJobCreate(_Body):
    model_id: str
    training_data_url: str
    config: SFTConfig | None = None


class KeyCreate(_Body):
    """A scoped key: every model of `projects`, and the single `models` ("project/name")."""

    name: str = Field(default="", max_length=200)
    projects: list[str] = Field(default_factory=list)
    models: list[str] = Field(default_factory=list)


__all__ = [
    "NAME_PATTERN",
    "DeleteCheckpoints",
    "ExperimentalTrainingConfig",
    "KeyCreate",
    "LogRequest",
    "ModelCreate",
    "SFTConfig",
    "SFTTrainingJobCreate",
    "TrainingJobCreate",
]
