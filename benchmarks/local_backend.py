"""LocalBackend against its peers, measured in one process and one run.

1. Rollout throughput: completion tokens/s of the in-process LocalBackend through its
   OpenAI-compatible endpoint (`model.openai_client()`), with 1 request at a time and
   with `--concurrency` requests in a closed loop, against Hugging Face `model.generate`
   on the same weights and dtype, one sequence at a time and as one left-padded batch.
   Ours and the peer take turns (`--rounds`), so drift in the machine's speed during the
   run weighs on both alike.
2. GRPO step time: wall seconds per step of the same work, P prompts x G generations of
   `examples/demo.py`'s arithmetic task, LoRA r=8 on art's default target modules:
   `art.gather_trajectory_groups` + `model.train` against TRL's `GRPOTrainer`. The reward
   adds a tie-break of 0.001 x the rollout's index in its group, so every group has reward
   variance and both trainers train every rollout: the same work on both sides. The two
   take their steps in turn (ours, TRL, ours, ...), each waiting while the other steps,
   so drift in the machine's speed during the run weighs on both alike.

Peak RSS is printed beside each time: of the model service's process for ours, of this
process for the peers (each peak reset through /proc/PID/clear_refs before its part).

    python benchmarks/local_backend.py            # the full run (~10 minutes on 2 cores)
    python benchmarks/local_backend.py --quick    # a tiny smoke setting (seconds of work)

Every number is printed beside its peer's and the ratio; benchmarks/README.md says
what each one means. TRL comes from the `bench` extra:
`pip install -c constraints.txt -e '.[bench]'`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

# Set before the Hugging Face libraries are imported: they read these on import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import torch
from support.demo import demo_module
from support.machine import machine
from support.trl_data import trl_dataset

import art
from art.core.data.dev import PeftArgs
from art.core.gather import completion_tokens
from art.local import LocalBackend
from art.runtime import models
from art.runtime.chat_format import render_prompt, rendering_for
from art.runtime.service.model_service import _stop_token_ids  # the engine's own stop rule
from art.runtime.trainer.peft_trainer import lora_config

# Open-ended requests, so most completions run to max_tokens and the decode loop, not
# the HTTP round trip, is what is measured. Ours and both peers cycle through the same list.
THROUGHPUT_PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a rainbow forms.",
    "Describe your ideal weekend in detail.",
    "Give me a recipe for pancakes.",
    "Why is the sky blue? Explain it to a child.",
    "Write a poem about the ocean.",
    "What are the benefits of learning a second language?",
    "Describe the water cycle step by step.",
    "Tell me about the history of bicycles.",
    "How do airplanes stay in the air?",
    "Write a letter to a friend you have not seen in years.",
    "What makes a good teacher?",
    "Describe a busy market in a big city.",
    "Explain what a computer program is.",
    "Write a short dialogue between a cat and a dog.",
    "What should I pack for a week of hiking?",
    "Describe how bread is made.",
    "Why do leaves change color in autumn?",
    "Write a product description for a new kind of umbrella.",
    "Explain the rules of chess briefly.",
    "Tell a story about a robot who learns to paint.",
    "What are some ways to save energy at home?",
    "Describe the planets of the solar system.",
    "Write a motivational speech for a sports team.",
    "How does a library organize its books?",
    "Describe a thunderstorm from the point of view of a bird.",
    "What are the main parts of a flower?",
    "Write instructions for planting a tree.",
    "Explain why exercise is good for health.",
    "Describe the perfect cup of tea.",
    "Tell me a fairy tale about a brave mouse.",
    "What happens when water freezes?",
]


@dataclass(frozen=True)
class BenchArgs:
    """What one run measures."""

    base_model: str = models.DEFAULT_MODEL  # served, trained and given to both peers
    parts: tuple[str, ...] = ("rollout", "grpo")  # which halves to run
    # --- rollout throughput ---
    concurrency: int = 32  # concurrent requests of the closed loop, and the peer's batch size
    max_tokens: int = 64  # completion tokens per request (fewer where the model stops)
    seconds: float = 30.0  # measured wall time of each throughput measurement, all rounds
    warmup_seconds: float = 5.0  # unmeasured time before each round of a measurement
    rounds: int = 3  # ours and the peer take turns, each measured `seconds / rounds` a turn
    serve_base: bool = False  # request the base model (adapter off), not the trainable one
    # --- GRPO step ---
    prompts: int = 8  # P: arithmetic questions per step (the same ones every step)
    generations: int = 8  # G: rollouts per question
    max_completion_tokens: int = 24  # completion length limit of each rollout
    learning_rate: float = 2e-4
    warmup_steps: int = 1  # untimed steps before the timed ones, for both trainers
    steps: int = 3  # timed steps
    seed: int = 0


# Added to rollout k of each group's reward: no group is without reward variance, so
# neither trainer skips (ours) or trains at zero advantage (TRL) any of them.
TIE_BREAK = 1e-3

# A smoke setting (tests/test_benchmarks.py runs it): every measurement and the report on
# tiny work, numbers not worth keeping.
QUICK = BenchArgs(
    concurrency=4,
    max_tokens=8,
    seconds=1.0,
    warmup_seconds=0.0,
    rounds=1,
    prompts=1,
    generations=2,
    max_completion_tokens=8,
    warmup_steps=0,
    steps=1,
)


# --- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    """Completion tokens per second of one throughput measurement."""

    tokens_per_s: float
    requests: int  # completed requests (sequences) that overlap the measured window
    mean_tokens: float  # completion tokens per request, the stop token included
    peak_rss_gib: float = 0.0  # of the process that sampled, during this measurement


def reset_peak_rss(pid: int) -> None:
    """Start VmHWM (peak RSS) of `pid` afresh from its current RSS (Linux)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak_rss_gib(pid: int) -> float:
    """VmHWM of `pid` in GiB, 0.0 where /proc does not say."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024**2
    return 0.0


@dataclass(frozen=True)
class StepTimes:
    """Wall seconds of the timed GRPO steps, and what happened in them."""

    seconds: list[float]
    generate_seconds: list[float]  # of those, time spent sampling the rollouts
    mean_completion_tokens: float
    mean_reward: float
    trained_tokens: float  # completion tokens trained per step
    peak_rss_gib: float  # of the process that sampled and trained

    @property
    def mean(self) -> float:
        return statistics.fmean(self.seconds)


class Turns:
    """Ours and TRL take their GRPO steps in turn, ours first: each side waits for its turn
    before a step and gives it to the other after; a side that has finished (or failed)
    leaves the other to step without waiting."""

    SIDES = ("ours", "TRL")

    def __init__(self) -> None:
        self._turn = "ours"
        self._finished: set[str] = set()
        self._changed = threading.Condition()

    def wait(self, side: str) -> None:
        other = self._other(side)
        with self._changed:
            self._changed.wait_for(lambda: self._turn == side or other in self._finished)

    def give(self, side: str) -> None:
        with self._changed:
            self._turn = self._other(side)
            self._changed.notify_all()

    def finish(self, side: str) -> None:
        with self._changed:
            self._finished.add(side)
            self._turn = self._other(side)
            self._changed.notify_all()

    @classmethod
    def alone(cls, side: str) -> Turns:
        """Turns for `side` with no one to take turns with: it never waits."""
        turns = cls()
        turns.finish(turns._other(side))
        return turns

    def _other(self, side: str) -> str:
        return self.SIDES[1 - self.SIDES.index(side)]


# --- the task shared by both GRPO trainers -----------------------------------------------


def _questions(args: BenchArgs) -> list[tuple[int, int]]:
    rng = random.Random(args.seed)
    return [(rng.randint(1, 20), rng.randint(1, 20)) for _ in range(args.prompts)]


def _arithmetic_messages(system: str, a: int, b: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"What is {a} + {b}?"},
    ]


# --- rollout throughput ----------------------------------------------------------------------


async def ours_throughput(
    model: art.TrainableModel, args: BenchArgs, concurrency: int
) -> Throughput:
    """A closed loop: `concurrency` workers, each sending its next request when one returns.

    Each completed request counts its tokens in proportion to the part of its duration
    inside the measured window, so requests straddling either edge count fairly.
    """
    client = model.openai_client()
    # The trainable model's name serves its LoRA adapter, as rollouts use it; the base
    # model's name serves the same weights with the adapter switched off, as the peer has.
    served = args.base_model if args.serve_base else model.get_inference_name()
    prompts = itertools.cycle(THROUGHPUT_PROMPTS)
    records: list[tuple[float, float, int]] = []  # (start, end, completion tokens)
    started = time.perf_counter()
    window_start = started + args.warmup_seconds
    window_end = window_start + args.seconds

    async def worker() -> None:
        while time.perf_counter() < window_end:
            begin = time.perf_counter()
            completion = await client.chat.completions.create(
                model=served,
                messages=[{"role": "user", "content": next(prompts)}],
                max_tokens=args.max_tokens,
                temperature=1.0,
            )
            assert completion.usage is not None
            records.append((begin, time.perf_counter(), completion.usage.completion_tokens))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    tokens = 0.0
    counted: list[int] = []
    for begin, end, count in records:
        overlap = min(end, window_end) - max(begin, window_start)
        if overlap > 0:
            tokens += count * overlap / (end - begin)
            counted.append(count)
    return Throughput(tokens / args.seconds, len(counted), statistics.fmean(counted))


def generate_throughput(
    hf_model: Any, tokenizer: Any, prompt_ids: list[list[int]], args: BenchArgs, batch: int
) -> Throughput:
    """Plain `model.generate`, `batch` left-padded sequences per call, calls back to back."""
    from transformers import GenerationConfig

    stop = sorted(_stop_token_ids(hf_model, tokenizer))
    pad = tokenizer.pad_token_id
    config = GenerationConfig(
        max_new_tokens=args.max_tokens,
        do_sample=True,
        temperature=1.0,
        top_k=0,  # transformers samples from the top 50 unless told otherwise; we never filter
        top_p=1.0,
        eos_token_id=stop,
        pad_token_id=pad,
    )
    calls = itertools.count()

    def call() -> list[int]:
        index = next(calls)
        rows = [prompt_ids[(index * batch + i) % len(prompt_ids)] for i in range(batch)]
        longest = max(len(row) for row in rows)
        input_ids = torch.full((batch, longest), pad, dtype=torch.long)
        attention = torch.zeros((batch, longest), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, longest - len(row) :] = torch.tensor(row)
            attention[i, longest - len(row) :] = 1
        with torch.inference_mode():
            output = hf_model.generate(
                input_ids=input_ids, attention_mask=attention, generation_config=config
            )
        counts = []
        for row in output[:, longest:].tolist():
            ends = [i for i, token in enumerate(row) if token in stop]
            counts.append(ends[0] + 1 if ends else len(row))  # the stop token counts, as ours
        return counts

    deadline = time.perf_counter() + args.warmup_seconds
    while True:
        call()
        if time.perf_counter() >= deadline:
            break
    counts: list[int] = []
    started = time.perf_counter()
    while True:
        counts += call()
        elapsed = time.perf_counter() - started
        if elapsed >= args.seconds:
            break
    return Throughput(sum(counts) / elapsed, len(counts), statistics.fmean(counts))


def plain_transformers(base_model: str) -> tuple[Any, Any]:
    """The weights and dtype the service loads, with transformers' own SDPA attention (the
    service's loader sets our one-token decode attention on a CPU; the peers get none of it)."""
    hf_model, tokenizer = models.load(models.resolve(base_model))
    hf_model.set_attn_implementation("sdpa")
    return hf_model, tokenizer


def generate_peer_inputs(args: BenchArgs) -> tuple[Any, Any, list[list[int]]]:
    """The peer's model and prompts: the same weights and dtype, loaded as the service loads
    them, with the prompts rendered and tokenized exactly as the endpoint does."""
    hf_model, tokenizer = plain_transformers(args.base_model)
    template = rendering_for(tokenizer)
    prompt_ids = [
        tokenizer(
            render_prompt(tokenizer, [{"role": "user", "content": p}], None, template),
            add_special_tokens=False,
        ).input_ids
        for p in THROUGHPUT_PROMPTS
    ]
    return hf_model, tokenizer, prompt_ids


def _combined(rounds: list[Throughput]) -> Throughput:
    """One measurement of equal-length rounds: tokens/s and tokens/request averaged, the
    largest peak RSS."""
    requests = sum(r.requests for r in rounds)
    return Throughput(
        statistics.fmean(r.tokens_per_s for r in rounds),
        requests,
        sum(r.mean_tokens * r.requests for r in rounds) / max(requests, 1),
        max(r.peak_rss_gib for r in rounds),
    )


async def rollout_part(
    model: art.TrainableModel, args: BenchArgs, service_pid: int
) -> dict[str, Throughput]:
    """Ours and the peer take turns, `args.rounds` rounds of each measurement, so a
    machine that speeds up or slows down during the run (a shared VM does) weighs on both
    sides alike."""
    c = args.concurrency
    turn = replace(args, seconds=args.seconds / args.rounds)
    hf_model, tokenizer, prompt_ids = generate_peer_inputs(args)
    torch.manual_seed(args.seed)
    rounds: dict[str, list[Throughput]] = {}
    for index in range(args.rounds):
        print(f"rollout throughput, round {index + 1}/{args.rounds}: ours @1 ...", flush=True)
        rounds.setdefault("ours@1", []).append(await ours_throughput(model, turn, 1))
        print("  HF generate @1 ...", flush=True)
        rounds.setdefault("generate@1", []).append(
            generate_throughput(hf_model, tokenizer, prompt_ids, turn, 1)
        )
        print(f"  ours @{c} ...", flush=True)
        reset_peak_rss(service_pid)
        ours = await ours_throughput(model, turn, c)
        rounds.setdefault(f"ours@{c}", []).append(
            replace(ours, peak_rss_gib=peak_rss_gib(service_pid))
        )
        print(f"  HF generate batch @{c} ...", flush=True)
        reset_peak_rss(os.getpid())
        peer = generate_throughput(hf_model, tokenizer, prompt_ids, turn, c)
        rounds.setdefault(f"generate-batch@{c}", []).append(
            replace(peer, peak_rss_gib=peak_rss_gib(os.getpid()))
        )
    return {name: _combined(measured) for name, measured in rounds.items()}


# --- GRPO step ---------------------------------------------------------------------------------


async def ours_grpo(
    model: art.TrainableModel,
    args: BenchArgs,
    demo: ModuleType,
    service_pid: int,
    history: Path,
    turns: Turns | None = None,
) -> StepTimes:
    """One step = gather P groups x G rollouts through the endpoint + `model.train`; with
    `turns`, each step in ours' turn (without, steps follow each other)."""
    turns = turns or Turns.alone("ours")
    client = model.openai_client()
    reset_peak_rss(service_pid)
    questions = _questions(args)

    async def rollout(a: int, b: int, index: int) -> art.Trajectory:
        trajectory = art.Trajectory(messages_and_choices=_arithmetic_messages(demo.SYSTEM, a, b))
        completion = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=trajectory.messages(),
            max_tokens=args.max_completion_tokens,
            temperature=1.0,
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        trajectory.reward = demo.reward(choice.message.content or "", a + b) + TIE_BREAK * index
        return trajectory

    seconds: list[float] = []
    generate_seconds: list[float] = []
    tokens: list[float] = []
    rewards: list[float] = []
    trained: list[float] = []
    try:
        for step in range(args.warmup_steps + args.steps):
            await asyncio.to_thread(turns.wait, "ours")
            started = time.perf_counter()
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(rollout(a, b, k) for k in range(args.generations))
                    for a, b in questions
                ),
                pbar_desc=None,
            )
            gathered = time.perf_counter()
            await model.train(groups, config=art.TrainConfig(learning_rate=args.learning_rate))
            finished = time.perf_counter()
            turns.give("ours")
            label = "warmup" if step < args.warmup_steps else "timed"
            print(f"  ours step {step + 1} ({label}): {finished - started:.1f}s", flush=True)
            if step >= args.warmup_steps:
                seconds.append(finished - started)
                generate_seconds.append(gathered - started)
                trajectories = [t for group in groups for t in group.trajectories]
                tokens += [float(completion_tokens(t)) for t in trajectories]
                rewards += [t.reward for t in trajectories]
                trained.append(await asyncio.to_thread(_last_tokens_trained, history))
    finally:
        turns.finish("ours")
    return StepTimes(
        seconds,
        generate_seconds,
        statistics.fmean(tokens),
        statistics.fmean(rewards),
        statistics.fmean(trained),
        peak_rss_gib(service_pid),
    )


def _last_tokens_trained(history: Path) -> float:
    """The tokens the last training row of a model's history.jsonl trained (ART's name)."""
    key = "data/step_loss_bearing_tokens"
    rows = [json.loads(line) for line in history.read_text().splitlines()]
    return float([row for row in rows if key in row][-1][key])


def trl_grpo(
    args: BenchArgs, demo: ModuleType, dtype: torch.dtype, output_dir: str, turns: Turns
) -> StepTimes:
    """TRL's GRPOTrainer on the same prompts, reward, LoRA, learning rate and dtype, each
    optimizer step taken in its turn (`turns`); its model loads in its first turn."""
    turns.wait("TRL")
    try:
        return _trl_steps(args, demo, dtype, output_dir, turns)
    finally:
        turns.finish("TRL")


def _trl_steps(
    args: BenchArgs, demo: ModuleType, dtype: torch.dtype, output_dir: str, turns: Turns
) -> StepTimes:
    """`trl_grpo`'s work, begun in TRL's turn."""
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepClock(TrainerCallback):
        """Gives the turn away after each optimizer step and waits for TRL's next one;
        records the step's wall time (its turn's), and its mean completion length and reward
        (read before TRL averages and clears its metrics, which it does whenever it logs)."""

        def __init__(self) -> None:
            self.started = 0.0
            self.seconds: list[float] = []
            self.lengths: list[float] = []
            self.rewards: list[float] = []
            self.metrics: dict[str, list[float]] = {}  # the trainer's own, set once it exists

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.seconds.append(time.perf_counter() - self.started)
            turns.give("TRL")
            self.lengths.append(self.metrics["completions/mean_length"][-1])
            self.rewards.append(self.metrics["reward"][-1])
            label = "warmup" if len(self.seconds) <= args.warmup_steps else "timed"
            print(f"  TRL step {len(self.seconds)} ({label}): {self.seconds[-1]:.1f}s", flush=True)
            turns.wait("TRL")
            self.started = time.perf_counter()

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer, unchanged, with the time of each sampling call recorded."""

        generate_seconds: list[float]

        def _generate_single_turn(self, *a: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return super()._generate_single_turn(*a, **kw)
            finally:
                self.generate_seconds.append(time.perf_counter() - started)

    def reward(
        completions: list[list[dict[str, str]]], expected: list[int], **_: Any
    ) -> list[float]:
        # TRL lists each prompt's G completions together, so k % G is the index in the group.
        return [
            demo.reward(c[0]["content"], e) + TIE_BREAK * (k % args.generations)
            for k, (c, e) in enumerate(zip(completions, expected, strict=True))
        ]

    questions = _questions(args)
    dataset = trl_dataset(
        [
            {"prompt": _arithmetic_messages(demo.SYSTEM, a, b), "expected": a + b}
            for a, b in questions
        ]
    )
    peft = PeftArgs()
    config = GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=dtype == torch.bfloat16,
        # One optimizer step = P prompts x G generations, sampled in one `generate` call
        # and trained G sequences per forward/backward (ours: 8 per micro-batch).
        num_generations=args.generations,
        per_device_train_batch_size=args.generations,
        gradient_accumulation_steps=args.prompts,
        max_steps=args.warmup_steps + args.steps,
        max_completion_length=args.max_completion_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        use_vllm=False,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        # As ours: AdamW(0.9, 0.99), no weight decay, grad norm clipped at 1, no KL term,
        # CISPO's token-level loss (TRL's epsilon_high is the ratio's cap, ours 1 + 0.2).
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="cispo",
        epsilon_high=1.2,
        scale_rewards="group",
        # TRL turns gradient checkpointing on by default; ours does not checkpoint.
        gradient_checkpointing=False,
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=args.seed,
    )
    hf_model, tokenizer = plain_transformers(args.base_model)
    clock = StepClock()
    trainer = TimedGRPOTrainer(
        model=hf_model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(peft),  # exactly the adapter art trains
        callbacks=[clock],
    )
    trainer.generate_seconds = []
    trainer.remove_callback(PrinterCallback)  # it would print the end-of-training log
    clock.metrics = trainer._metrics["train"]
    # Sampling runs through `model.generate` on the CPU: no vLLM, no accelerator.
    assert trainer.accelerator.device.type == "cpu"
    assert not trainer.use_vllm
    assert not trainer.use_transformers_continuous_batching
    reset_peak_rss(os.getpid())
    trainer.train()
    timed = slice(args.warmup_steps, None)
    mean_length = statistics.fmean(clock.lengths[timed])
    return StepTimes(
        clock.seconds[timed],
        trainer.generate_seconds[timed],
        mean_length,
        statistics.fmean(clock.rewards[timed]),
        # Every completion token of every rollout: with the tie-break no advantage is 0.
        mean_length * args.prompts * args.generations,
        peak_rss_gib(os.getpid()),
    )


# --- the report ------------------------------------------------------------------------------


def _ratio_line(label: str, ratio: float, bar: str = "", passed: bool | None = None) -> str:
    verdict = "" if passed is None else ("  PASS" if passed else "  FAIL")
    return f"  {label:<34} {ratio:>7.2f}x  {bar}{verdict}".rstrip()


def report(
    args: BenchArgs,
    dtype: torch.dtype,
    rollout: dict[str, Throughput] | None,
    ours: StepTimes | None,
    trl: StepTimes | None,
) -> None:
    print()
    print(f"machine: {machine()}")
    print(f"model:   {args.base_model}, dtype {str(dtype).removeprefix('torch.')}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    print(f"load average at the end: {load:.1f} (other work on this CPU skews every figure)")
    if rollout is not None:
        c = args.concurrency
        print()
        print(
            f"rollout throughput: completion tokens/s, temperature 1.0, max_tokens "
            f"{args.max_tokens}, {args.seconds:g}s measured in {args.rounds} rounds taken in turn "
            f"with the peer, each after {args.warmup_seconds:g}s warmup"
        )
        served = "base model, adapter off" if args.serve_base else "trainable model, LoRA on"
        print(f"  ours serves the {served}; the peer runs the base model")
        print(f"  {'':<34} {'tokens/s':>9} {'requests':>9} {'tokens/request':>15} {'peak RSS':>9}")
        names = {
            "ours@1": "ours @1 (sequential requests)",
            f"ours@{c}": f"ours @{c} (closed loop)",
            "generate@1": "HF generate @1",
            f"generate-batch@{c}": f"HF generate batch @{c} (left pad)",
        }
        for key, name in names.items():
            result = rollout[key]
            peak = f"{result.peak_rss_gib:.2f} GiB" if result.peak_rss_gib else ""
            print(
                f"  {name:<34} {result.tokens_per_s:>9.1f} {result.requests:>9d} "
                f"{result.mean_tokens:>15.1f} {peak:>9}"
            )
        tps = {key: result.tokens_per_s for key, result in rollout.items()}
        batch = tps[f"ours@{c}"] / tps[f"generate-batch@{c}"]
        # The bars are #49's (2x at 32 rows, GRPO 0.35x of TRL's time) and #40's at batch 1
        # (1.3x), which #49 does not set.
        print(_ratio_line(f"ours@{c} / generate-batch@{c}", batch, "(bar >= 2x)", batch >= 2.0))
        single = tps["ours@1"] / tps["generate@1"]
        print(_ratio_line("ours@1 / generate@1", single, "(bar >= 1.3x)", single >= 1.3))
        print(_ratio_line(f"ours@{c} / generate@1", tps[f"ours@{c}"] / tps["generate@1"]))
    if ours is not None and trl is not None:
        print()
        print(
            f"GRPO step: {args.prompts} prompts x {args.generations} generations, "
            f"max {args.max_completion_tokens} tokens, LoRA r={PeftArgs().r}, lr "
            f"{args.learning_rate:g}; {args.warmup_steps} warmup + {args.steps} timed steps"
        )
        print(
            f"  {'':<6} {'s/step':>7} {'min':>6} {'max':>6} {'sampling s':>11} "
            f"{'tokens/rollout':>15} {'trained tokens':>15} {'s/1k trained':>13} "
            f"{'reward':>7} {'peak RSS':>9}"
        )
        for name, times in (("ours", ours), ("TRL", trl)):
            print(
                f"  {name:<6} {times.mean:>7.2f} {min(times.seconds):>6.2f} "
                f"{max(times.seconds):>6.2f} {statistics.fmean(times.generate_seconds):>11.2f} "
                f"{times.mean_completion_tokens:>15.1f} {times.trained_tokens:>15.0f} "
                f"{1000 * times.mean / max(times.trained_tokens, 1):>13.2f} "
                f"{times.mean_reward:>7.2f} {times.peak_rss_gib:>5.2f} GiB"
            )
        ratio = ours.mean / trl.mean
        print(_ratio_line("ours / TRL seconds per step", ratio, "(bar <= 0.35x)", ratio <= 0.35))


# --- the run ---------------------------------------------------------------------------------


async def run(args: BenchArgs) -> None:
    dtype = models.torch_dtype("auto")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > 0.5:
        # On a shared CPU the numbers are noise, and torch's spinning worker threads can
        # make them far worse (OMP_NUM_THREADS=1 keeps a smoke run usable there).
        print(f"warning: load average {load:.1f} before the run: other work shares this CPU")
    demo = demo_module()
    rollout: dict[str, Throughput] | None = None
    ours: StepTimes | None = None
    trl: StepTimes | None = None
    with tempfile.TemporaryDirectory(prefix="art-bench-") as path:
        backend = LocalBackend(path=path)  # the default: the model service in its own process
        try:
            print(
                f"loading {args.base_model} into LocalBackend (model service in a child process) ...",
                flush=True,
            )
            model = art.TrainableModel(name="bench", project="bench", base_model=args.base_model)
            await model.register(backend)
            service_pid = backend._service._process.pid  # type: ignore[union-attr]
            if "rollout" in args.parts:
                rollout = await rollout_part(model, args, service_pid)
            if "grpo" in args.parts:
                print("GRPO step: ours and TRL GRPOTrainer, a step each in turn ...", flush=True)
                history = Path(path) / "bench" / "models" / "bench" / "history.jsonl"
                turns = Turns()
                # TRL trains in a thread of this process; each side steps only in its turn.
                ours, trl = await asyncio.gather(
                    ours_grpo(model, args, demo, service_pid, history, turns),
                    asyncio.to_thread(trl_grpo, args, demo, dtype, str(Path(path) / "trl"), turns),
                )
        finally:
            await backend.close()
    report(args, dtype, rollout, ours, trl)


def parse_args(argv: Sequence[str] | None = None) -> BenchArgs:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny smoke setting (each option's default under --quick is in its help)",
    )
    parser.add_argument("--parts", nargs="+", choices=("rollout", "grpo"))
    parser.add_argument(
        "--serve-base",
        action="store_true",
        help="rollout throughput of the base model (LoRA adapter off), as the peer runs it",
    )
    defaults = BenchArgs()
    options: dict[str, Callable[[str], Any]] = {
        "base_model": str,
        "concurrency": int,
        "max_tokens": int,
        "seconds": float,
        "warmup_seconds": float,
        "rounds": int,
        "prompts": int,
        "generations": int,
        "max_completion_tokens": int,
        "learning_rate": float,
        "warmup_steps": int,
        "steps": int,
        "seed": int,
    }
    for name, kind in options.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=kind,
            help=f"default {getattr(defaults, name)} ({getattr(QUICK, name)} with --quick)",
        )
    parsed = parser.parse_args(argv)
    if parsed.rounds is not None and parsed.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {parsed.rounds}")
    args = QUICK if parsed.quick else defaults
    given = {name: getattr(parsed, name) for name in options if getattr(parsed, name) is not None}
    if parsed.parts:
        given["parts"] = tuple(parsed.parts)
    if parsed.serve_base:
        given["serve_base"] = True
    return replace(args, **given)


if __name__ == "__main__":
    asyncio.run(run(parse_args()))
