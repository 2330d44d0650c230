"""The checks of PipelineTrainer's arguments: each is honoured or refused here, by name."""

from __future__ import annotations

from typing import Any

from ..core.data.errors import ConfigError
from ..core.model import TrainableModel
from ..pipeline_tuner.config import PipelineAutotuneConfig, PipelineRuntimeConfig


def check_backend_serves_while_training(backend: Any, model: TrainableModel) -> None:
    supports = getattr(backend, "_supports_concurrent_training_and_inference", None)
    if supports is None:
        raise ConfigError(
            "backend",
            f"is a {type(backend).__name__}, which does not say it serves while it trains; "
            "PipelineTrainer runs on a LocalBackend in dedicated mode or a RayBackend",
            "Use art.local.LocalBackend with a model in dedicated mode, or RayBackend",
        )
    if not supports(model):
        raise ConfigError(
            "backend",
            "PipelineTrainer only supports LocalBackend in dedicated mode: a shared "
            "LocalBackend pauses inference while each step trains, so rollouts would wait "
            "for training",
            "Give the model _internal_config=art.dev.InternalModelConfig(trainer_gpu_ids=[0], "
            "inference_gpu_ids=[1]) on a machine with two GPUs, or trainer_gpu_ids=[], "
            "inference_gpu_ids=[] on a CPU machine (its own serving copy and threads)",
        )


def refuse_unsupported(**values: object) -> None:
    """ART's PipelineTrainer on a LocalBackend in dedicated mode refuses these too."""
    fixes = {
        "loss_fn_config": "leave it None, as ART's PipelineTrainer on a dedicated "
        "LocalBackend requires; the loss is shaped by loss_fn (and art.dev.TrainConfig)",
        "adam_params": "leave it None, as ART's PipelineTrainer on a dedicated LocalBackend "
        "requires; AdamW's settings are the model's: _internal_config="
        "art.dev.InternalModelConfig(trainer_args=art.dev.TrainerArgs(...))",
    }
    for name, value in values.items():
        if value is not None:
            raise ConfigError(
                name, "is not taken by PipelineTrainer on a LocalBackend", fixes[name]
            )


def check_kl_lag(kl_penalty_step_lag: int | None, kl_penalty_coef: float) -> None:
    """A lag names the KL penalty's reference, so it needs a penalty (as backend.train's
    kl_penalty_reference_step does; ART's PipelineTrainer drops it silently)."""
    if kl_penalty_step_lag is not None and not kl_penalty_coef:
        raise ConfigError(
            "kl_penalty_step_lag",
            f"is {kl_penalty_step_lag}, but kl_penalty_coef is 0: there is no KL penalty "
            "to take a reference for",
            "Set kl_penalty_coef > 0, or leave kl_penalty_step_lag None",
        )


_ALIASES = ("num_rollout_workers", "min_batch_size", "max_batch_size", "queue_maxsize")


def runtime_config(
    pipeline: object | None, autotune: object | None, **aliases: int | None
) -> PipelineRuntimeConfig:
    """ART 0.5.23's `pipeline=PipelineRuntimeConfig(...)`, or ART 0.5.18's direct sizes
    (`aliases`, still taken); giving both, or either beside an autotuner, is refused."""
    given = {name: value for name, value in aliases.items() if value is not None}
    tuned = isinstance(autotune, PipelineAutotuneConfig) and autotune.mode != "off"
    if pipeline is None:
        defaults = {name: PipelineRuntimeConfig.model_fields[name].default for name in _ALIASES}
        check_ranges(**(defaults | given))  # a ConfigError naming the field, not pydantic's
        return PipelineRuntimeConfig(**given)
    if not isinstance(pipeline, PipelineRuntimeConfig):
        raise ConfigError(
            "pipeline",
            f"is a {type(pipeline).__name__}",
            "Pass art.pipeline_trainer.PipelineRuntimeConfig(num_rollout_workers=..., ...)",
        )
    if tuned:
        raise ConfigError(
            "pipeline",
            "is given, but the autotuner owns the pipeline's settings (as in ART)",
            "Leave pipeline=None, or use autotune=None",
        )
    if given:
        first = next(iter(given))
        raise ConfigError(
            first,
            "is given beside pipeline=PipelineRuntimeConfig(...); ART takes one or the other",
            f"Move it into the config: pipeline=PipelineRuntimeConfig({first}=...)",
        )
    return pipeline


def check_ranges(**values: float | None) -> None:
    minimum = {
        "num_rollout_workers": 1,
        "min_batch_size": 1,
        "max_batch_size": 1,
        "queue_maxsize": 1,
        "max_steps": 0,
        "discard_queue_multiplier": 1,
        "max_steps_off_policy": 0,
        "eval_every_n_steps": 0,
        "grad_accumulation_sequences": 1,
        "kl_penalty_coef": 0,
        "kl_penalty_step_lag": 1,
        "limit_mean_steps_off_policy": 0,
    }
    positive = {"score_reference_groups_per_step", "score_reference_rollouts_per_group"}
    for name, value in values.items():
        if value is None:
            continue
        if name in minimum and value < minimum[name]:
            raise ConfigError(name, f"is {value}", f"Use a value >= {minimum[name]}")
        if name in positive and value <= 0:
            raise ConfigError(name, f"is {value}", "Use a value > 0, or None")
    low, high = values.get("min_batch_size"), values.get("max_batch_size")
    if low is not None and high is not None and high < low:
        raise ConfigError(
            "max_batch_size", f"is {high}, below min_batch_size={low}", "Use max >= min"
        )


__all__ = [
    "check_backend_serves_while_training",
    "check_kl_lag",
    "check_ranges",
    "refuse_unsupported",
    "runtime_config",
]
