"""How far the sampler's logprobs are from the trainer's, per decoding path, in bf16.

GRPO's importance ratio divides the trainer's probability of each sampled token by the
sampler's. In fp32 the two agree to 1e-4 on every path (tests/runtime/test_decode_paths.py); in
bf16 they never agree exactly, since decoding with a KV cache rounds differently from
one full-sequence pass. This prints, for each path the transformers engine can take,
|sampler logprob - trainer logprob| over the sampled tokens:

- `modules`: the PEFT-wrapped model through transformers' modules (`merge_lora=False`);
- `merged`: the plain copy with the adapter merged in, decoded by `lean_decode`, with
  the prefix cache (the prompts share the chat template's opening).

The adapter's B matrices are drawn at `--scale` (an update of the size a few training
steps make); the trainer's side is one forward pass over prompt + completion of the
wrapped model, as `PeftTrainer` computes it.

    python benchmarks/sampler_fidelity.py            # ~1 minute on 2 cores
    python benchmarks/sampler_fidelity.py --quick    # a smoke setting: 1 prompt, 4 tokens
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from support.machine import machine

from art.core.data.dev import PeftArgs
from art.runtime import models
from art.runtime.engines.base import SamplingParams
from art.runtime.engines.transformers.engine import TransformersEngine
from art.runtime.engines.transformers.merged import MergedCopy
from art.runtime.trainer.peft_trainer import add_adapter

QUESTIONS = [
    "Write a poem about the sea.",
    "What is 7 + 8?",
    "Describe a cat.",
    "Explain why it rains.",
]


def engine_samples(
    model: Any, tokenizer: Any, merged: MergedCopy | None, prompts: list[list[int]], tokens: int
) -> list[tuple[list[int], list[int], list[float]]]:
    """(prompt, sampled ids, sampler logprobs) of 4 samples per prompt, temperature 1."""
    engine = TransformersEngine(
        model,
        tokenizer,
        max_num_seqs=64,
        stop_token_ids=set(),
        merged=merged,
    )

    async def sample() -> list[Any]:
        params = SamplingParams(max_tokens=tokens, temperature=1.0)
        return list(
            await asyncio.gather(
                *(engine.generate(prompt, params, n=4, adapter="policy") for prompt in prompts)
            )
        )

    try:
        torch.manual_seed(0)
        results = asyncio.run(sample())
    finally:
        engine.close()
    return [
        (prompt, sample.token_ids, sample.logprobs)
        for prompt, samples in zip(prompts, results, strict=True)
        for sample in samples
    ]


def trainer_gaps(
    model: Any, samples: list[tuple[list[int], list[int], list[float]]]
) -> torch.Tensor:
    """|sampler - trainer| logprob of every sampled token; the trainer's is one full pass."""
    gaps = []
    with torch.no_grad():
        for prompt, ids, logprobs in samples:
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
            trainer = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
            gaps.append((trainer - torch.tensor(logprobs)).abs())
    return torch.cat(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1e-3, help="std of the LoRA B entries")
    parser.add_argument("--tokens", type=int, default=48, help="completion tokens per sample")
    parser.add_argument("--dtype", default="auto", help="as InitArgs.dtype (auto: bf16 here)")
    parser.add_argument("--quick", action="store_true", help="1 prompt, 4 tokens per sample")
    args = parser.parse_args()
    questions = QUESTIONS[:1] if args.quick else QUESTIONS
    if args.quick:
        args.tokens = 4

    path = models.resolve(models.DEFAULT_MODEL)
    model, tokenizer = models.load(path, args.dtype)
    model = add_adapter(model, "policy", PeftArgs(), seed=0)
    model.set_adapter("policy")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, args.scale, generator=torch.Generator().manual_seed(1))
    plain, _ = models.load(path, args.dtype)
    plain.requires_grad_(False)
    prompts = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        )
        for q in questions
    ]
    print(f"machine: {machine()}")
    print(
        f"model: {models.DEFAULT_MODEL}, dtype {str(model.dtype).removeprefix('torch.')}, "
        f"LoRA B ~ N(0, {args.scale:g}), {len(prompts)} prompts x 4 samples x {args.tokens} tokens"
    )
    print(
        f"  {'path':<9} {'tokens':>7} {'mean':>8} {'p99':>8} {'max':>8}   |sampler - trainer| logprob"
    )
    for name, merged in (("modules", None), ("merged", MergedCopy(model, plain))):
        gaps = trainer_gaps(model, engine_samples(model, tokenizer, merged, prompts, args.tokens))
        print(
            f"  {name:<9} {len(gaps):>7} {gaps.mean():>8.4f} "
            f"{gaps.quantile(0.99):>8.4f} {gaps.max():>8.4f}"
        )


if __name__ == "__main__":
    main()
