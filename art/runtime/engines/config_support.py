"""What this machine's LocalBackend can honour of an `InternalModelConfig`.

Every field is either used or refused here, at registration, with an error that names
it and says what to do: none is accepted and then dropped.

Per engine:
- `engine_args.max_num_seqs`, `max_model_len`: both engines.
- `engine_args.gpu_memory_utilization`: vLLM only (on CPU, vLLM's share of RAM).
- `engine_args.enforce_eager`: vLLM only (no CUDA graphs).
- `engine_args.merge_lora`, and ART's `rollout_weights_mode` which says the same
  ('merged' / 'lora'): the transformers engine only, and not with adapters on the
  embeddings or LM head; vLLM samples with LoRA ('lora' is its only mode).
- `trainer_backend='unsloth'`: where its environment is found (`make venv-unsloth`), in
  shared mode; `init_args.load_in_4bit` with it only (bitsandbytes, CPU included).
- `trainer_gpu_ids` / `inference_gpu_ids` (dedicated mode): training and inference run
  side by side, so inference never pauses for a step (PipelineTrainer needs this). On
  CUDA: vLLM on `inference_gpu_ids`, the trainer on `trainer_gpu_ids[0]`. On a machine
  without CUDA: both lists empty (`[]`, "no GPU for either"), with the transformers engine;
  the engine decodes from its own copy of the weights in its own thread, the trainer
  trains its copy in another, and each side's torch ops get half the cores.
"""

from __future__ import annotations

from pathlib import Path

from ...core import dev
from ...core.errors import ConfigError
from .base import EngineName
from .transformers.merged import mergeable


def merge_lora(config: dev.InternalModelConfig) -> bool | None:
    """Whether the transformers engine samples from a merged copy: `engine_args.merge_lora`
    or ART's `rollout_weights_mode` ('merged' / 'lora'); None: the engine decides."""
    if config.rollout_weights_mode is not None:
        return config.rollout_weights_mode == "merged"
    return config.engine_args.merge_lora


def _check_rollout_weights_mode(config: dev.InternalModelConfig) -> None:
    mode, merge = config.rollout_weights_mode, config.engine_args.merge_lora
    if mode is not None and merge is not None and (mode == "merged") != merge:
        raise ConfigError(
            "_internal_config.rollout_weights_mode",
            f"is {mode!r} while engine_args.merge_lora is {merge}: they say the opposite",
            "Set one of them (rollout_weights_mode is ART's name for the same choice)",
        )


def check_supported(config: dev.InternalModelConfig, engine: EngineName) -> None:
    """Raise `ConfigError` for the first setting `engine` and the trainer cannot honour."""
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
    if engine == "vllm":
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
        _check_vllm(config)
        return
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


def is_cpu_dedicated(config: dev.InternalModelConfig) -> bool:
    """Dedicated mode on the CPU: both GPU lists given and empty."""
    return config.trainer_gpu_ids == [] and config.inference_gpu_ids == []


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


def _check_vllm(config: dev.InternalModelConfig) -> None:
    if config.trainer_gpu_ids is None:
        return
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


__all__ = ["check_supported", "is_cpu_dedicated"]
