"""What the vLLM engine honours of an `InternalModelConfig`; the rest it refuses.

- `engine_args.max_num_seqs`, `max_model_len`, `gpu_memory_utilization` (on CPU,
  vLLM's share of RAM), `enforce_eager` (no CUDA graphs): honoured.
- `engine_args.merge_lora`, and `rollout_weights_mode='merged'`: the transformers
  engine's; vLLM samples with LoRA ('lora' is its only mode).
- `trainer_gpu_ids` / `inference_gpu_ids` (dedicated mode): on CUDA, vLLM on
  `inference_gpu_ids`, the trainer on `trainer_gpu_ids[0]`.
- `vllm_runtime.mode='external'` (a server you run, `external.py`): the engine_args that
  launch vLLM are refused (the server has its own), `trainer_gpu_ids` alone places the
  trainer.
"""

from __future__ import annotations

from ....core.data import dev
from ....core.data.errors import ConfigError


def check_config(config: dev.InternalModelConfig) -> None:
    """Raise `ConfigError` for the first engine setting of `config` this engine cannot honour."""
    if config.engine_args.merge_lora is not None:
        raise ConfigError(
            "_internal_config.engine_args.merge_lora",
            "chooses how the transformers engine samples; vLLM applies LoRA adapters "
            "with its own kernels",
            "Remove merge_lora, or set engine='transformers'",
        )
    if config.rollout_weights_mode == "merged":
        raise ConfigError(
            "_internal_config.rollout_weights_mode",
            "is 'merged', but the vLLM engine here loads each checkpoint as a LoRA "
            "adapter; pushing merged weights into vLLM is not built",
            "Use rollout_weights_mode='lora' (or leave it unset), or set "
            "engine='transformers', whose 'merged' mode samples from a merged copy",
        )
    if config.external_vllm is not None:
        from .external import check_external_config

        check_external_config(config)
        _check_trainer_gpu(config)
    elif config.trainer_gpu_ids is not None:
        _check_dedicated(config)


def _check_trainer_gpu(config: dev.InternalModelConfig) -> None:
    """External mode: `trainer_gpu_ids`, if given, names one GPU this machine has."""
    if config.trainer_gpu_ids is None:
        return
    import torch

    count = torch.cuda.device_count()
    if len(config.trainer_gpu_ids) != 1 or not 0 <= config.trainer_gpu_ids[0] < count:
        raise ConfigError(
            "_internal_config.trainer_gpu_ids",
            f"is {config.trainer_gpu_ids}; the PEFT trainer trains on one GPU of this "
            f"machine's {count}",
            "Give one GPU id this machine has, or leave trainer_gpu_ids unset",
        )


def _check_dedicated(config: dev.InternalModelConfig) -> None:
    """vLLM's dedicated mode: GPUs this machine has, one for the trainer, some for vLLM."""
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            "_internal_config.trainer_gpu_ids",
            "dedicated mode puts training and vLLM on separate GPUs, and this machine has none",
            "Use engine='transformers' with trainer_gpu_ids=[] and inference_gpu_ids=[] "
            "(dedicated mode on the CPU), or leave both unset",
        )
    if not config.trainer_gpu_ids or not config.inference_gpu_ids:
        raise ConfigError(
            "_internal_config.trainer_gpu_ids",
            "is empty: vLLM's dedicated mode needs a GPU for the trainer and one for vLLM",
            "Name the GPUs, e.g. trainer_gpu_ids=[0], inference_gpu_ids=[1]",
        )
    count = torch.cuda.device_count()
    wanted = [*config.trainer_gpu_ids, *(config.inference_gpu_ids or [])]
    missing = [i for i in wanted if not 0 <= i < count]
    if missing:
        raise ConfigError(
            "_internal_config.inference_gpu_ids",
            f"names GPUs {missing}, and this machine has {count} (0 to {count - 1})",
            "Use GPU ids this machine has",
        )
    if len(config.trainer_gpu_ids) != 1:
        raise ConfigError(
            "_internal_config.trainer_gpu_ids",
            f"names {len(config.trainer_gpu_ids)} GPUs; the PEFT trainer trains on one",
            "Give trainer_gpu_ids one GPU",
        )


__all__ = ["check_config"]
