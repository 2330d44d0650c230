"""SFT tokens per second and peak RSS: our trainer against TRL's `SFTTrainer`, equal work.

Both sides train the same LoRA adapter (art's `PeftArgs` defaults: r, alpha, dropout,
target modules) on the default model, in the dtype art picks on this machine, on the same
synthetic chat examples (short sums answered as `[[answer: N]]`, and one in four a long
count, so sequence lengths vary), the same epochs, the same examples in each batch (one
optimizer step per batch, in the same order), the same learning rate and AdamW (0.9, 0.99,
no weight decay, gradient norm clipped at 1, constant rate), the loss the mean negative
log-likelihood of every assistant token of the batch.

- ours: `PeftTrainer.sft_step` per batch, as the model service calls it
  (`art/runtime/service/sft.py`), on the model loaded as the service loads it, with
  the service's chat template. Rendering and tokenizing each batch is part of that call,
  so it is inside our timed loop.
- TRL: `SFTTrainer` with `completion_only_loss=True`, handed the token ids and assistant
  mask our tokenizer makes (`input_ids` and `completion_mask`): TRL's own rendering of a
  prompt/completion pair gives the same ids but also trains the template's newline after
  `<|im_end|>`, one token more per example than ours. Its tokenizing happens in its
  constructor, outside its timed loop. `train_sampling_strategy="sequential"`, so its
  batches hold the same examples as ours; right padding (its default collator; padding-free
  needs FlashAttention); gradient checkpointing off as ours (TRL's default is on).

Tokens/s = trained (assistant) tokens / wall seconds of the training loop, model loading
excluded: ours from the first `sft_step` to the end of the last, TRL's from its
`on_train_begin` to its last `on_step_end`. Each side runs in a child process of its own,
which reports its own peak RSS (`getrusage(RUSAGE_SELF)`: loading included) and its RSS
once the model is loaded.

    python benchmarks/sft.py            # 192 examples, one epoch, batch 8 (21 minutes on 2 busy cores)
    python benchmarks/sft.py --quick    # 16 examples, batch 4, one epoch: a smoke setting

TRL comes from the `bench` extra: `pip install -c constraints.txt -e '.[bench]'`; without
it only our side runs, and the report says why.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

# Set before the Hugging Face libraries are imported: they read these on import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

from support.machine import machine
from support.trl_data import trl_dataset

import art
from art.runtime import models

TRL_MISSING = "TRL is not installed: pip install -c constraints.txt -e '.[bench]'"


@dataclass(frozen=True)
class BenchArgs:
    """What one run measures; both sides get the same."""

    examples: int = 192  # synthetic chat examples, one in four a long count
    epochs: int = 1  # passes over the examples
    batch_size: int = 8  # examples per optimizer step
    learning_rate: float = 2e-4
    seed: int = 0  # of the examples


# A smoke setting (tests/test_benchmarks.py runs it): the whole report on tiny work.
QUICK = BenchArgs(examples=16, epochs=1, batch_size=4)


@dataclass(frozen=True)
class SideResult:
    """What one side's child process measured."""

    seconds: float  # wall time of the training loop
    steps: int  # optimizer steps
    trained_tokens: int  # assistant tokens in the loss, all steps
    forward_tokens: int  # tokens the forward passes computed on, padding included
    losses: list[float]  # each step's loss
    peak_rss_gib: float  # the child's peak RSS, loading included
    loaded_rss_gib: float  # its RSS with the model loaded, before training
    tokenize_seconds: float = 0.0  # ours: rendering + tokenizing every example once, timed apart

    @property
    def tokens_per_s(self) -> float:
        return self.trained_tokens / self.seconds


# --- the data ------------------------------------------------------------------------------

SYSTEM = "You are a careful calculator. End every answer with [[answer: N]]."


def chat_examples(args: BenchArgs) -> list[list[dict[str, str]]]:
    """`args.examples` conversations (system, user, assistant). Three in four ask for a
    sum (~40 tokens, 7 of them the answer); every fourth asks to count by a step and add
    up, answered with the whole count (~70-250 tokens), so a batch mixes lengths."""
    rng = random.Random(args.seed)
    conversations = []
    for index in range(args.examples):
        if index % 4 == 3:
            step, terms = rng.randint(2, 19), rng.randint(8, 40)
            values = [step * k for k in range(1, terms + 1)]
            question = f"Count by {step} from {step} to {values[-1]}, then add the numbers up."
            answer = ", ".join(map(str, values)) + f". [[answer: {sum(values)}]]"
        else:
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            question, answer = f"What is {a} plus {b}?", f"[[answer: {a + b}]]"
        conversations.append(
            [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer},
            ]
        )
    return conversations


def _trajectories(args: BenchArgs) -> list[art.Trajectory]:
    return [art.Trajectory(messages_and_choices=m) for m in chat_examples(args)]


# --- the two sides, each run in a child process --------------------------------------------


def _rss_gib() -> float:
    """This process's RSS now (Linux), 0.0 where /proc does not say."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024**2
    return 0.0


def _peak_rss_gib() -> float:
    # ru_maxrss is in KiB on Linux, bytes on macOS.
    scale = 1024**3 if sys.platform == "darwin" else 1024**2
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def _progress(side: str, step: int, args: BenchArgs, started: float) -> None:
    """A line every eighth step, so a slow run shows it is moving."""
    steps = args.epochs * -(-args.examples // args.batch_size)
    if step % 8 == 0 or step == steps:
        elapsed = time.perf_counter() - started
        print(f"  {side}: step {step}/{steps}, {elapsed:.0f}s", file=sys.stderr, flush=True)


def ours(args: BenchArgs) -> SideResult:
    """`PeftTrainer.sft_step` per batch on the model and template the service would load."""
    from art.runtime.chat_format import rendering_for
    from art.runtime.trainer.peft_trainer import PeftTrainer, add_adapter
    from art.runtime.trainer.tokenize import tokenize_trajectory

    model, tokenizer = models.load(models.resolve(models.DEFAULT_MODEL))
    trainer_args = art.dev.TrainerArgs()
    peft_model = add_adapter(model, "default", art.dev.PeftArgs(), seed=trainer_args.seed)
    trainer = PeftTrainer(
        peft_model, tokenizer, init_args=art.dev.InitArgs(), trainer_args=trainer_args
    )
    template = rendering_for(tokenizer)
    trajectories = _trajectories(args)
    batches = [
        trajectories[i : i + args.batch_size] for i in range(0, len(trajectories), args.batch_size)
    ]
    loaded = _rss_gib()

    losses: list[float] = []
    trained = forward = 0
    started = time.perf_counter()
    for _ in range(args.epochs):
        for batch in batches:
            metrics = trainer.sft_step(
                batch, args.learning_rate, art.dev.TrainSFTConfig(), template
            )
            losses.append(metrics["loss"])
            trained += int(metrics["tokens_trained"])
            forward += int(metrics["forward_tokens"])
            _progress("ours", len(losses), args, started)
    seconds = time.perf_counter() - started

    # The share of the loop that was rendering and tokenizing, measured apart once.
    tokenize_started = time.perf_counter()
    for trajectory in trajectories:
        tokenize_trajectory(
            trajectory,
            tokenizer,
            group_index=0,
            trajectory_index=0,
            rendering=template,
            allow_training_without_logprobs=True,
        )
    tokenize_seconds = (time.perf_counter() - tokenize_started) * args.epochs
    return SideResult(
        seconds=seconds,
        steps=len(losses),
        trained_tokens=trained,
        forward_tokens=forward,
        losses=losses,
        peak_rss_gib=_peak_rss_gib(),
        loaded_rss_gib=loaded,
        tokenize_seconds=tokenize_seconds,
    )


def trl(args: BenchArgs, output_dir: str) -> SideResult:
    """TRL's `SFTTrainer` on the token ids and assistant masks ours trains."""
    import torch
    from transformers import PrinterCallback, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from art.runtime.chat_format import rendering_for
    from art.runtime.trainer.peft_trainer import lora_config
    from art.runtime.trainer.tokenize import tokenize_trajectory

    class Clock(TrainerCallback):
        """The wall time at the start of training and at the end of each step; each
        step's loss (TRL logs every step here)."""

        def __init__(self) -> None:
            self.marks: list[float] = []
            self.losses: list[float] = []

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            self.marks.append(time.perf_counter())

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.marks.append(time.perf_counter())
            _progress("TRL", len(self.marks) - 1, args, self.marks[0])

        def on_log(self, *_: Any, logs: dict[str, float] | None = None, **__: Any) -> None:
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

    # The weights and dtype ours trains, with transformers' own SDPA attention (the
    # service's loader sets a one-token decode attention on a CPU, which training never uses).
    hf_model, tokenizer = models.load(models.resolve(models.DEFAULT_MODEL))
    hf_model.set_attn_implementation("sdpa")
    template = rendering_for(tokenizer)
    rows = []
    for trajectory in _trajectories(args):
        [sequence] = tokenize_trajectory(
            trajectory,
            tokenizer,
            group_index=0,
            trajectory_index=0,
            rendering=template,
            allow_training_without_logprobs=True,
        )
        rows.append(
            {"input_ids": sequence.token_ids, "completion_mask": [int(t) for t in sequence.trained]}
        )
    config = SFTConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=hf_model.dtype == torch.bfloat16,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=1,
        num_train_epochs=args.epochs,
        train_sampling_strategy="sequential",  # the same examples in each batch as ours
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        # As ours (TrainerArgs, TrainSFTConfig defaults): torch's AdamW (0.9, 0.99), no
        # weight decay, gradient norm clipped at 1.
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        completion_only_loss=True,  # labels from `completion_mask`: the assistant tokens
        max_length=None,  # no sequence here is near the model's context
        gradient_checkpointing=False,  # TRL's default is on; ours does not checkpoint these
        logging_strategy="steps",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=art.dev.TrainerArgs().seed,  # seeds the adapter's initialisation, as ours
    )
    clock = Clock()
    trainer = SFTTrainer(
        model=hf_model,
        args=config,
        train_dataset=trl_dataset(rows),
        processing_class=tokenizer,
        peft_config=lora_config(art.dev.PeftArgs()),  # exactly the adapter art trains
        callbacks=[clock],
    )
    trainer.remove_callback(PrinterCallback)  # it would print every step's log
    assert trainer.accelerator.device.type == "cpu"
    loaded = _rss_gib()
    trainer.train()

    # Position 0 predicts nothing; TRL's labels are shifted inside the model.
    labels = trainer.train_dataset["labels"]
    trained = sum(sum(label != -100 for label in row[1:]) for row in labels)
    lengths = [len(row) for row in labels]
    padded = sum(
        len(lengths[i : i + args.batch_size]) * max(lengths[i : i + args.batch_size])
        for i in range(0, len(lengths), args.batch_size)
    )
    return SideResult(
        seconds=clock.marks[-1] - clock.marks[0],
        steps=len(clock.marks) - 1,
        trained_tokens=trained * args.epochs,
        forward_tokens=padded * args.epochs,
        losses=clock.losses,
        peak_rss_gib=_peak_rss_gib(),
        loaded_rss_gib=loaded,
    )


def run_side(side: str, args: BenchArgs) -> SideResult:
    """One side in a child process of this script, so its peak RSS is its own."""
    with tempfile.TemporaryDirectory(prefix=f"art-bench-sft-{side}-") as path:
        result = Path(path) / "result.json"
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                side,
                "--child-args",
                json.dumps(asdict(args)),
                "--child-result",
                str(result),
            ],
            check=True,
            env=os.environ | {"TRL_EXPERIMENTAL_SILENCE": "1"},
        )
        return SideResult(**json.loads(result.read_text()))


def child(side: str, args: BenchArgs, result: Path) -> None:
    measured = ours(args) if side == "ours" else trl(args, str(result.parent / "trl"))
    result.write_text(json.dumps(asdict(measured)))


# --- the report ----------------------------------------------------------------------------


def _ratio_line(label: str, ratio: float, bar: str, passed: bool) -> str:
    return f"  {label:<34} {ratio:>7.2f}x  {bar}  {'PASS' if passed else 'FAIL'}"


def report(args: BenchArgs, ours: SideResult, peer: SideResult | None, why_not: str) -> None:
    dtype = models.torch_dtype("auto")
    print()
    print(f"machine: {machine()}")
    print(f"model:   {models.DEFAULT_MODEL}, dtype {str(dtype).removeprefix('torch.')}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    print(f"load average at the end: {load:.1f} (other work on this CPU skews every figure)")
    print()
    peft = art.dev.PeftArgs()
    print(
        f"SFT: {args.examples} examples x {args.epochs} epoch{'s' * (args.epochs != 1)}, "
        f"batch {args.batch_size}, "
        f"LoRA r={peft.r} alpha={peft.lora_alpha} dropout {peft.lora_dropout:g}, "
        f"lr {args.learning_rate:g}, AdamW"
    )
    print(
        f"  {'':<18} {'steps':>5} {'seconds':>8} {'trained tokens':>15} {'forward tokens':>15} "
        f"{'tokens/s':>9} {'first loss':>11} {'last loss':>10} {'RSS loaded':>11} {'peak RSS':>9}"
    )
    rows = [("ours PeftTrainer", ours)]
    if peer is not None:
        rows.append(("TRL SFTTrainer", peer))
    for name, side in rows:
        print(
            f"  {name:<18} {side.steps:>5d} {side.seconds:>8.1f} {side.trained_tokens:>15d} "
            f"{side.forward_tokens:>15d} {side.tokens_per_s:>9.1f} {side.losses[0]:>11.4f} "
            f"{side.losses[-1]:>10.4f} {side.loaded_rss_gib:>7.2f} GiB {side.peak_rss_gib:>5.2f} GiB"
        )
    print(
        f"  of ours' seconds, rendering and tokenizing the examples (timed apart): "
        f"{ours.tokenize_seconds:.1f}"
    )
    if peer is None:
        print(f"  TRL SFTTrainer: not measured: {why_not}")
        print(f"  ours / TRL tokens per second: not measured: {why_not}")
        return
    speed = ours.tokens_per_s / peer.tokens_per_s
    memory = ours.peak_rss_gib / peer.peak_rss_gib
    print(_ratio_line("ours / TRL tokens per second", speed, "(bar >= 1.5x)", speed >= 1.5))
    print(_ratio_line("ours / TRL peak RSS", memory, "(bar <= 1.0x)", memory <= 1.0))
    print(
        "  mean loss of the last epoch, ours / TRL: "
        f"{statistics.fmean(ours.losses[-len(ours.losses) // args.epochs :]):.4f} / "
        f"{statistics.fmean(peer.losses[-len(peer.losses) // args.epochs :]):.4f}"
    )


# --- the run -------------------------------------------------------------------------------


def run(args: BenchArgs) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > 0.5:
        print(f"warning: load average {load:.1f} before the run: other work shares this CPU")
    print("SFT: ours (PeftTrainer.sft_step) in a child process ...", flush=True)
    mine = run_side("ours", args)
    peer: SideResult | None = None
    why_not = ""
    if importlib.util.find_spec("trl") is None:
        why_not = TRL_MISSING
    else:
        print("SFT: TRL SFTTrainer in a child process ...", flush=True)
        peer = run_side("trl", args)
    report(args, mine, peer, why_not)


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, BenchArgs]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny smoke setting (each option's default under --quick is in its help)",
    )
    defaults = BenchArgs()
    options: dict[str, Callable[[str], Any]] = {
        "examples": int,
        "epochs": int,
        "batch_size": int,
        "learning_rate": float,
        "seed": int,
    }
    for name, kind in options.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=kind,
            help=f"default {getattr(defaults, name)} ({getattr(QUICK, name)} with --quick)",
        )
    parser.add_argument("--child", choices=("ours", "trl"), help=argparse.SUPPRESS)
    parser.add_argument("--child-args", help=argparse.SUPPRESS)
    parser.add_argument("--child-result", help=argparse.SUPPRESS)
    parsed = parser.parse_args(argv)
    if parsed.child:
        return parsed, BenchArgs(**json.loads(parsed.child_args))
    args = QUICK if parsed.quick else defaults
    given = {name: getattr(parsed, name) for name in options if getattr(parsed, name) is not None}
    args = replace(args, **given)
    for name in ("examples", "epochs", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return parsed, args


if __name__ == "__main__":
    parsed, bench_args = parse_args()
    if parsed.child:
        child(parsed.child, bench_args, Path(parsed.child_result))
    else:
        run(bench_args)
