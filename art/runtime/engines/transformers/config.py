"""What the transformers engine honours of an `InternalModelConfig`; the rest it refuses.

- `engine_args.max_num_seqs`, `max_model_len`: honoured.
- `engine_args.merge_lora`, and ART's `rollout_weights_mode` which says the same
  ('merged' / 'lora'): whether it samples from a merged copy (`merged.py`); refused
  with adapters on the embeddings or LM head.
- `engine_args.gpu_memory_utilization`, `enforce_eager`: vLLM's, refused.
- `trainer_gpu_ids` / `inference_gpu_ids` (dedicated mode): on a machine without CUDA,
  both lists empty (`[]`, "no GPU for either"): the engine decodes from its own copy of
  the weights in its own thread, the trainer trains its copy in another, and each side's
  torch ops get half the cores.
"""

from __future__ import annotations

from ....core.data import dev
from ....core.data.errors import ConfigError
from ..config_support import is_cpu_dedicated
from .merged import mergeable


def merge_lora(config: dev.InternalModelConfig) -> bool | None:
    """Whether the transformers engine samples from a merged copy: `engine_args.merge_lora`
    or ART's `rollout_weights_mode` ('merged' / 'lora'); None: the engine decides."""
    if config.rollout_weights_mode is not None:
        return config.rollout_weights_mode == "merged"
    return config.engine_args.merge_lora


def check_config(config: dev.InternalModelConfig) -> None:
    """Raise `ConfigError` for the first engine setting of `config` this engine cannot honour."""
    if merge_lora(config) and not mergeable(config.peft_args.target_modules):
        raise ConfigError(
            "_internal_config.rollout_weights_mode"
            if config.engine_args.merge_lora is None
            else "_internal_config.engine_args.merge_lora",
            "cannot merge adapters on the embeddings or LM head (peft_args.target_modules "
            f"{list(config.peft_args.target_modules)}) into the sampling copy",
            "Leave it unset, or target only the decoder's projections",
        )
    no_vllm = "needs engine='vllm'; the transformers engine serves this model"
    if config.engine_args.gpu_memory_utilization is not None:
        raise ConfigError(
            "_internal_config.engine_args.gpu_memory_utilization",
            "is vLLM's share of GPU memory, which " + no_vllm + " (it allocates as it decodes)",
            "Remove gpu_memory_utilization, or set engine='vllm'",
        )
    if config.engine_args.enforce_eager:
        raise ConfigError(
            "_internal_config.engine_args.enforce_eager",
            "turns off vLLM's CUDA graphs, which " + no_vllm + " (it runs eagerly)",
            "Remove enforce_eager, or set engine='vllm'",
        )
    if config.trainer_gpu_ids is not None:
        _check_cpu_dedicated(config)


def _check_cpu_dedicated(config: dev.InternalModelConfig) -> None:
    """The transformers engine's dedicated mode: on a machine without CUDA, with no GPU ids."""
    import torch

    if torch.cuda.is_available():
        raise ConfigError(
            "_internal_config.trainer_gpu_ids",
            "dedicated mode on a CUDA machine runs vLLM on inference_gpu_ids, and the "
            "transformers engine serves this model",
            "Set engine='vllm' with GPU ids, or leave trainer_gpu_ids and inference_gpu_ids unset",
        )
    if not is_cpu_dedicated(config):
        raise ConfigError(
            "_internal_config.trainer_gpu_ids",
            f"names GPUs ({config.trainer_gpu_ids} and {config.inference_gpu_ids}), and this "
            "machine has none",
            "For dedicated mode on the CPU give both lists empty: trainer_gpu_ids=[], "
            "inference_gpu_ids=[]; or leave both unset (shared mode)",
        )
    if config.trainer_args.memory_budget_gb is not None:
        raise ConfigError(
            "_internal_config.trainer_args.memory_budget_gb",
            "cannot be held in dedicated mode on the CPU: the step leaves glibc's mmap "
            "threshold to the decode loop beside it, so its freed activations stay resident",
            "Leave memory_budget_gb unset in dedicated mode, or use shared mode",
        )


__all__ = ["check_config", "merge_lora"]
