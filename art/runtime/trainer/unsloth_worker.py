"""The Unsloth trainer's child process: a `PeftTrainer` on Unsloth's model, behind a pipe.

Run by `unsloth_trainer.UnslothTrainer` with `.venv-unsloth`'s interpreter (Unsloth pins a
transformers and a TRL older than the service's), with only the `art` package on its path:

    python -P -m art.runtime.trainer.unsloth_worker <read fd> <write fd>

It reads requests from one pipe and answers on the other (`multiprocessing.connection`
framing, plain JSON-like values only: the two interpreters share no classes). The first
request sets up; each later one is a `Trainer` method (`step`, `sft_step`, `save`,
`restore`). Its stdout and stderr go to a log file. When the service dies, even by SIGKILL,
the request pipe reaches end of file and this process exits.

Setup, top to bottom: the base with `FastLanguageModel.from_pretrained` (InitArgs: the
dtype the service resolved, `max_seq_length`, `load_in_4bit`), the adapter with
`FastLanguageModel.get_peft_model` (PeftArgs, `TrainerArgs.seed` as its `random_state`),
then our `PeftTrainer` on that PEFT model: the same loss, step body, micro-batch plan,
memory budget and metrics as the PEFT trainer, and checkpoints written by the same
`save` (a plain PEFT adapter that both engines load).

Gradient checkpointing is ours, not Unsloth's: `get_peft_model` is given
`use_gradient_checkpointing=False` and `PeftTrainer` turns checkpointing on per
micro-batch where its memory plan needs it (transformers' own), as it does for the PEFT
trainer. Unsloth's mode ("unsloth") is fixed for the model's life and offloads activations
from the GPU to CPU memory, which on the CPU saves nothing; on CUDA it is the one Unsloth
feature this trainer leaves unused.
"""

from __future__ import annotations

import json
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ...core.data import dev
from ...core.data.errors import ArtValueError, ConfigError, TrainingError
from ...core.data.trajectories import Trajectory, TrajectoryGroup
from ...core.data.types import TrainConfig


def setup(
    weights: str,
    dtype: str,
    config: dict[str, Any],
    start_from: str | None,
) -> Any:
    """Load the base and adapter with Unsloth and return a `PeftTrainer` on them."""
    # Unsloth first: it must be imported before transformers and PEFT.
    from unsloth import FastLanguageModel

    # isort: split
    import torch
    from transformers import AutoTokenizer

    from .peft_trainer import PeftTrainer

    internal = dev.InternalModelConfig(**config)
    init, peft_args = internal.init_args, internal.peft_args
    if start_from is not None:  # the adapter's own shape, as the service's copy has it
        peft_args = _adapter_shape(Path(start_from), peft_args)
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    try:
        model, _ = FastLanguageModel.from_pretrained(
            model_name=weights,
            max_seq_length=init.max_seq_length,
            dtype=dtypes[dtype],
            load_in_4bit=init.load_in_4bit,
        )
    except Exception as error:  # Unsloth's refusals are plain exceptions: name the field
        field, fix = (
            ("init_args.load_in_4bit", "Leave load_in_4bit False, or use trainer_backend='peft'")
            if init.load_in_4bit
            else ("trainer_backend", "Use trainer_backend='peft' (or leave it unset)")
        )
        raise ConfigError(
            f"_internal_config.{field}",
            f"Unsloth could not load {weights}: {type(error).__name__}: {error}",
            fix,
        ) from error
    peft_model = FastLanguageModel.get_peft_model(
        model,
        r=peft_args.r,
        lora_alpha=peft_args.lora_alpha,
        lora_dropout=peft_args.lora_dropout,
        target_modules=list(peft_args.target_modules),
        bias="none",
        use_gradient_checkpointing=False,  # ours, per micro-batch: see the module docstring
        random_state=internal.trainer_args.seed,
    )
    tokenizer = AutoTokenizer.from_pretrained(weights)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    trainer = PeftTrainer(
        peft_model,
        tokenizer,
        init_args=init,
        trainer_args=internal.trainer_args,
    )
    if start_from is not None:
        trainer.restore(Path(start_from))
    return trainer


def _adapter_shape(directory: Path, peft_args: dev.PeftArgs) -> dev.PeftArgs:
    """`peft_args` with the rank, scaling, dropout and targets of the adapter saved in
    `directory` (an SFT adapter given as `base_model` may differ from the defaults)."""
    saved = json.loads((directory / "adapter_config.json").read_text())
    targets = saved.get("target_modules") or peft_args.target_modules
    return dev.PeftArgs(
        r=saved.get("r", peft_args.r),
        lora_alpha=saved.get("lora_alpha", peft_args.lora_alpha),
        lora_dropout=saved.get("lora_dropout", peft_args.lora_dropout),
        target_modules=tuple(sorted(targets)) if isinstance(targets, list) else targets,
    )


def handle(trainer: Any, method: str, kwargs: dict[str, Any]) -> Any:
    """Run one `Trainer` method on `trainer` with JSON-like arguments."""
    if method == "step":
        return trainer.step(
            [TrajectoryGroup.model_validate_json(text) for text in kwargs["groups"]],
            TrainConfig.model_validate(kwargs["config"]),
            dev.TrainConfig.model_validate(kwargs["dev_config"]),
            kwargs["rendering"],
        )
    if method == "sft_step":
        return trainer.sft_step(
            [Trajectory.model_validate_json(text) for text in kwargs["trajectories"]],
            kwargs["learning_rate"],
            dev.TrainSFTConfig.model_validate(kwargs["dev_config"]),
            kwargs["rendering"],
        )
    if method == "save":
        trainer.save(Path(kwargs["directory"]))
        return None
    if method == "restore":
        trainer.restore(Path(kwargs["directory"]))
        return None
    raise ValueError(f"unknown request {method!r}")


def _error(error: BaseException) -> tuple[str, ...]:
    """An error as plain values: its kind, message and (for a field error) field and fix."""
    text = "".join(traceback.format_exception(error))
    print(text, file=sys.stderr, flush=True)
    if isinstance(error, ArtValueError):
        return ("config", error.field, error.problem, error.fix)
    if isinstance(error, TrainingError):
        return ("training", str(error))
    return ("crash", f"{type(error).__name__}: {error}")


def main(read_fd: int, write_fd: int) -> None:
    requests = Connection(read_fd, writable=False)
    replies = Connection(write_fd, readable=False)
    try:
        trainer = setup(**requests.recv())
    except EOFError:
        return
    except Exception as error:
        replies.send(("error", *_error(error)))
        return
    replies.send(("ok", None))
    while True:
        try:
            method, kwargs = requests.recv()
        except EOFError:  # the service closed its end, or died
            return
        try:
            result = handle(trainer, method, kwargs)
        except Exception as error:
            replies.send(("error", *_error(error)))
        else:
            replies.send(("ok", result))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
