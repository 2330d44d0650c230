"""Pydantic's validation errors turned into `ConfigError`s that name the field and the fix.

Every config class of `art` (`TrainConfig`, `art.dev.*`, `Model`) derives from
`ConfigModel`, so a bad value raises `ConfigError` (an `ArtError` and a `ValueError`)
instead of pydantic's `ValidationError`. A key that ART's open config dicts accept but
this version does not gets its own message, saying what to use instead.
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from .errors import ConfigError

_VLLM = "a vLLM engine argument; this version serves with its own engine and supports only EngineArgs(max_num_seqs, max_model_len). Remove it"

# Keys ART users pass in `art.dev.InitArgs/EngineArgs/TrainerArgs/InternalModelConfig`
# (ART's own TypedDicts) that have no field here, with what to do instead.
ART_KEYS: dict[tuple[str, str], str] = {
    (
        "InitArgs",
        "gpu_memory_utilization",
    ): "vLLM's GPU memory share is EngineArgs(gpu_memory_utilization=...), with engine='vllm'",
    (
        "InitArgs",
        "fast_inference",
    ): "vLLM inference is chosen with InternalModelConfig(engine='vllm'); remove fast_inference",
    ("InitArgs", "max_lora_rank"): "the LoRA rank is PeftArgs(r=...); remove max_lora_rank",
    (
        "InitArgs",
        "model_name",
    ): "the base model is TrainableModel(base_model=...); remove model_name",
    (
        "InitArgs",
        "load_in_8bit",
    ): "8-bit loading is not supported; remove it (dtype= picks bf16/fp32)",
    ("InitArgs", "full_finetuning"): "training updates a LoRA adapter only; remove full_finetuning",
    (
        "InitArgs",
        "use_gradient_checkpointing",
    ): "gradient checkpointing is TrainerArgs(gradient_checkpointing=True/False; None decides per micro-batch)",
    (
        "InitArgs",
        "random_state",
    ): "the trainer's seed is TrainerArgs(seed=...); remove random_state",
    ("InitArgs", "enable_prefix_caching"): _VLLM,
    ("InitArgs", "disable_log_stats"): _VLLM,
    ("EngineArgs", "tensor_parallel_size"): _VLLM,
    ("EngineArgs", "enable_sleep_mode"): _VLLM,
    ("EngineArgs", "num_scheduler_steps"): _VLLM,
    ("EngineArgs", "enable_prefix_caching"): _VLLM,
    ("EngineArgs", "max_num_batched_tokens"): _VLLM,
    ("EngineArgs", "disable_log_stats"): _VLLM,
    ("EngineArgs", "model"): "the base model is TrainableModel(base_model=...); remove model",
    (
        "TrainerArgs",
        "learning_rate",
    ): "the learning rate is art.TrainConfig(learning_rate=...), given to model.train",
    (
        "TrainerArgs",
        "max_grad_norm",
    ): "gradient clipping is art.dev.TrainConfig(max_grad_norm=...), given to model.train(_config=...)",
    ("TrainerArgs", "beta"): "the KL weight is art.TrainConfig(beta=...), given to model.train",
    (
        "TrainerArgs",
        "gradient_accumulation_steps",
    ): "micro-batching is art.dev.TrainConfig(gradient_accumulation_sequences=...); each model.train call is one optimizer step",
    (
        "TrainerArgs",
        "per_device_train_batch_size",
    ): "micro-batching is art.dev.TrainConfig(gradient_accumulation_sequences=...); each model.train call is one optimizer step",
    (
        "TrainerArgs",
        "num_train_epochs",
    ): "each model.train call is one optimizer step; remove num_train_epochs",
    ("TrainerArgs", "max_steps"): "each model.train call is one optimizer step; remove max_steps",
    ("TrainerArgs", "adam_epsilon"): "AdamW's epsilon is not configurable here; remove it",
    (
        "TrainerArgs",
        "optim",
    ): "the optimizer is AdamW (weight_decay, adam_beta1, adam_beta2); remove optim",
    (
        "TrainerArgs",
        "lr_scheduler_type",
    ): "the learning rate is given per step (art.TrainConfig(learning_rate=...)), so schedule it in your loop",
    (
        "TrainerArgs",
        "warmup_steps",
    ): "the learning rate is given per step (art.TrainConfig(learning_rate=...)), so warm it up in your loop",
    ("TrainerArgs", "logging_steps"): "every step is logged to history.jsonl; remove logging_steps",
    (
        "TrainerArgs",
        "report_to",
    ): "metrics go to history.jsonl (and the integrations in art.integrations); remove report_to",
    (
        "TrainerArgs",
        "output_dir",
    ): "checkpoints live under LocalBackend(path=...); remove output_dir",
    ("TrainerArgs", "bf16"): "the dtype is InitArgs(dtype='bfloat16'); remove bf16",
    ("TrainerArgs", "fp16"): "the dtype is InitArgs(dtype='float16'); remove fp16",
    (
        "InternalModelConfig",
        "trainer",
    ): "the trainer's arguments are trainer_args=TrainerArgs(...), and the trainer is chosen with trainer_backend='peft' (the default) or 'unsloth'",
    (
        "InternalModelConfig",
        "tinker_args",
    ): "the Tinker backend is not part of this version; remove tinker_args",
    (
        "InternalModelConfig",
        "tinker_native_args",
    ): "the Tinker backend is not part of this version; remove tinker_native_args",
    (
        "InternalModelConfig",
        "allow_unvalidated_arch",
    ): "there is no supported-architecture registry here to override: any model "
    "transformers and PEFT can load is served and trained; remove allow_unvalidated_arch",
    (
        "InternalModelConfig",
        "lora_config",
    ): "the adapter is PeftArgs(r, lora_alpha, lora_dropout, target_modules), as peft_args=",
}


def _model_at(root: type[BaseModel], path: tuple[Any, ...]) -> type[BaseModel]:
    """The config class that holds the last key of `path` (nested configs followed)."""
    model = root
    for key in path:
        field = model.model_fields.get(str(key))
        if field is None:
            break
        nested = [a for a in (field.annotation, *get_args(field.annotation)) if _is_model(a)]
        if not nested:
            break
        model = nested[0]
    return model


def _is_model(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def config_error(root: type[BaseModel], error: ValidationError) -> ConfigError:
    """A `ConfigError` for the first problem pydantic found, naming the field and the fix."""
    problems = error.errors()
    first = problems[0]
    loc = tuple(first["loc"])
    field = ".".join(str(part) for part in loc) or root.__name__
    owner = _model_at(root, loc[:-1])
    more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    inner = (first.get("ctx") or {}).get("error")
    if isinstance(inner, ConfigError):  # a nested config (given as a dict) already said why
        return ConfigError(f"{field}.{inner.field}", inner.problem + more, inner.fix)
    if first["type"] == "extra_forbidden":
        key = str(loc[-1])
        hint = ART_KEYS.get((owner.__name__, key))
        known = ", ".join(owner.model_fields)
        return ConfigError(
            field,
            f"{owner.__name__} has no setting {key!r}{more}",
            hint.rstrip(".") + "." if hint else f"Its settings are: {known}.",
        )
    description = None
    info = owner.model_fields.get(str(loc[-1])) if loc else None
    if info is not None:
        description = info.description
    got = f" (got {first['input']!r})" if "input" in first and first["type"] != "missing" else ""
    fix = f"{description}" if description else f"See {owner.__name__}'s fields"
    return ConfigError(field, f"{first['msg']}{got}{more}", fix.rstrip(".") + ".")


class ConfigModel(BaseModel):
    """A pydantic model whose bad values raise `ConfigError` naming the field."""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise config_error(type(self), error) from None

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as error:
            raise config_error(type(self), error) from None


__all__ = ["ART_KEYS", "ConfigModel", "config_error"]
