"""The checks of PipelineTrainer's arguments: each is honoured or refused here, by name."""

from __future__ import annotations

from typing import Any

from ..core.errors import ConfigError
from ..core.model import TrainableModel


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
    fixes = {
        "pipeline": "pass num_rollout_workers=, min_batch_size=, max_batch_size=, "
        "queue_maxsize= directly",
        "loss_fn_config": "leave it None; fine knobs are art.dev.TrainConfig's",
        "adam_params": "leave it None; the optimizer is set by art.dev.TrainerArgs",
        "kl_penalty_step_lag": "leave it None: the KL penalty is taken against the base model",
        "limit_mean_steps_off_policy": "bound staleness with max_steps_off_policy",
        "score_reference_groups_per_step": "leave it None",
        "score_reference_rollouts_per_group": "leave it None",
        "rollout_executor": "leave it None: rollouts run as tasks in this process",
    }
    for name, value in values.items():
        if value is not None:
            raise ConfigError(
                name, "is not supported by this version's PipelineTrainer", fixes[name]
            )


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
    }
    for name, value in values.items():
        if value is None:
            continue
        if name in minimum and value < minimum[name]:
            raise ConfigError(name, f"is {value}", f"Use a value >= {minimum[name]}")
    low, high = values["min_batch_size"], values["max_batch_size"]
    if low is not None and high is not None and high < low:
        raise ConfigError(
            "max_batch_size", f"is {high}, below min_batch_size={low}", "Use max >= min"
        )


__all__ = ["check_backend_serves_while_training", "check_ranges", "refuse_unsupported"]
