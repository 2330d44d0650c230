"""What this machine's LocalBackend can honour of an `InternalModelConfig`.

Every field is either used or refused here, at registration, with an error that names
it and says what to do: none is accepted and then dropped.
"""

from __future__ import annotations

from ...core import dev
from ...core.errors import ConfigError

_NO_VLLM = (
    "needs engine='vllm', and this version serves with its transformers engine only; leave it unset"
)


def check_supported(config: dev.InternalModelConfig) -> None:
    """Raise `ConfigError` for the first setting the transformers engine + PEFT cannot honour."""
    if config.engine not in (None, "transformers") or config.trainer not in (None, "peft"):
        raise ConfigError(
            "_internal_config",
            f"engine={config.engine!r}, trainer={config.trainer!r} is not available on this machine",
            "Leave engine and trainer unset (transformers + PEFT) for CPU training",
        )
    if config.init_args.load_in_4bit:
        raise ConfigError(
            "_internal_config.init_args.load_in_4bit",
            "4-bit base weights need CUDA, bitsandbytes and a 4-bit-aware trainer, which this "
            "version's transformers engine and PEFT trainer are not",
            "Leave load_in_4bit False; InitArgs(dtype='bfloat16') halves the weights' memory",
        )
    if config.engine_args.gpu_memory_utilization is not None:
        raise ConfigError(
            "_internal_config.engine_args.gpu_memory_utilization",
            "is vLLM's share of GPU memory, which "
            + _NO_VLLM.replace(
                "; leave", " (the transformers engine allocates as it decodes); leave"
            ),
            "Remove gpu_memory_utilization",
        )
    if config.engine_args.enforce_eager:
        raise ConfigError(
            "_internal_config.engine_args.enforce_eager",
            "turns off vLLM's CUDA graphs, which " + _NO_VLLM,
            "Remove enforce_eager (the transformers engine runs eagerly)",
        )
    if config.trainer_gpu_ids is not None or config.inference_gpu_ids is not None:
        raise ConfigError(
            "_internal_config.trainer_gpu_ids",
            "dedicated mode (training and inference on separate devices) is not built in this "
            "version: training and inference share the model and take turns",
            "Leave trainer_gpu_ids and inference_gpu_ids unset",
        )


__all__ = ["check_supported"]
