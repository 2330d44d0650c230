"""What this machine's LocalBackend can honour of an `InternalModelConfig`.

Every field is either used or refused at registration, with an error that names it and
says what to do: none is accepted and then dropped. Here are the fields every engine
shares; each engine checks its own (`transformers/config.py`, `vllm/config.py`), and
`start.check_supported`, the one place that names an engine kind, runs both.

- `chat_template_path`: a file.
- `rollout_weights_mode` and `engine_args.merge_lora` say the same; they may not disagree.
- `trainer_backend='unsloth'`: where its environment is found (`make venv-unsloth`), in
  shared mode; `init_args.load_in_4bit` with it only (bitsandbytes, CPU included).
- `trainer_gpu_ids` / `inference_gpu_ids` (dedicated mode): training and inference run
  side by side, so inference never pauses for a step (PipelineTrainer needs this); which
  GPU lists an engine takes is its own check.
"""

from __future__ import annotations

from pathlib import Path

from ...core.data import dev
from ...core.data.errors import ConfigError


def check_engine_neutral(config: dev.InternalModelConfig) -> None:
    """Raise `ConfigError` for the first setting no engine can honour with the trainer."""
    if config.chat_template_path is not None and not Path(config.chat_template_path).is_file():
        raise ConfigError(
            "_internal_config.chat_template_path",
            f"{config.chat_template_path!r} is not a file",
            "Give the path of a Jinja chat template, or the template itself as chat_template",
        )
    _check_rollout_weights_mode(config)
    if config.trainer_backend == "unsloth":
        _check_unsloth(config)
    elif config.init_args.load_in_4bit:
        raise ConfigError(
            "_internal_config.init_args.load_in_4bit",
            "4-bit base weights need bitsandbytes and a 4-bit-aware trainer, which the PEFT "
            "trainer is not",
            "Set trainer_backend='unsloth' (`make venv-unsloth`), or leave load_in_4bit False; "
            "InitArgs(dtype='bfloat16') halves the weights' memory",
        )


def is_cpu_dedicated(config: dev.InternalModelConfig) -> bool:
    """Dedicated mode on the CPU: both GPU lists given and empty."""
    return config.trainer_gpu_ids == [] and config.inference_gpu_ids == []


def _check_rollout_weights_mode(config: dev.InternalModelConfig) -> None:
    mode, merge = config.rollout_weights_mode, config.engine_args.merge_lora
    if mode is not None and merge is not None and (mode == "merged") != merge:
        raise ConfigError(
            "_internal_config.rollout_weights_mode",
            f"is {mode!r} while engine_args.merge_lora is {merge}: they say the opposite",
            "Set one of them (rollout_weights_mode is ART's name for the same choice)",
        )


def _check_unsloth(config: dev.InternalModelConfig) -> None:
    """The Unsloth trainer: its environment is here, and the mode is one it has."""
    from ..trainer.unsloth_trainer import require_unsloth_python

    if config.trainer_gpu_ids is not None:
        raise ConfigError(
            "_internal_config.trainer_gpu_ids",
            "dedicated mode is not built for the Unsloth trainer yet",
            "Leave trainer_gpu_ids and inference_gpu_ids unset with trainer_backend='unsloth', "
            "or use trainer_backend='peft' for dedicated mode",
        )
    require_unsloth_python()


__all__ = ["check_engine_neutral", "is_cpu_dedicated"]
