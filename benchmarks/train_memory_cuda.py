"""Peak GPU memory and seconds of one training step on long agent trajectories, on CUDA.

The trainer (`PeftTrainer`) against the plain PEFT loop on the same sequences: a randomly
initialised model of a 1B shape (Llama-3.2-1B's layers, SmolLM2's vocabulary and
tokenizer, bf16), LoRA r=8 on the 7 default modules, N trajectories of ~T + 150 tokens
shaped like a LangGraph ReAct agent's (see `train_memory.py`). Each side takes one
optimizer step over every sequence, one forward and backward per sequence:

- ours: `PeftTrainer.step` (token-budget micro-batches, SDPA, the LM head in checkpointed
  chunks on trained positions only, gradient checkpointing by length or budget);
- plain: the model's forward with gradient checkpointing on (transformers' own), full
  logits, `log_softmax` and a gather of the sampled tokens, the same token-level mean of
  advantage x log-probability.

Printed per setting: `torch.cuda.max_memory_allocated` and seconds of each, and their
ratios. A side that runs out of GPU memory is recorded as "OOM".

    python benchmarks/train_memory_cuda.py --settings 8x2048,32x4096
    python benchmarks/train_memory_cuda.py --quick    # a smoke setting: 4x256
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.machine import machine
from train_memory import agent_trajectory  # the same trajectories as the CPU benchmark

import art
from art.runtime.trainer.peft_trainer import PeftTrainer, create_peft_model
from art.runtime.trainer.tokenize import tokenize_trajectory

# Llama-3.2-1B's decoder (hidden, intermediate, layers, heads, kv heads).
_SHAPE = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16}
_HEADS = {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64}


def random_model(vocab: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
        **_SHAPE,
        **_HEADS,
    )
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    return model


def groups_of(tokenizer: Any, trajectories: int, answer_tokens: int) -> list[art.TrajectoryGroup]:
    return [
        art.TrajectoryGroup(agent_trajectory(tokenizer, g * 4 + k, answer_tokens) for k in range(4))
        for g in range(trajectories // 4)
    ]


def ours(model: Any, tokenizer: Any, groups: list[art.TrajectoryGroup]) -> dict[str, Any]:
    trainer = PeftTrainer(
        model, tokenizer, init_args=art.dev.InitArgs(), trainer_args=art.dev.TrainerArgs()
    )
    started = time.perf_counter()
    metrics = trainer.step(groups, art.TrainConfig(learning_rate=1e-5), art.dev.TrainConfig())
    torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - started, "tokens": metrics["tokens_trained"]}


def plain(model: Any, tokenizer: Any, groups: list[art.TrajectoryGroup]) -> dict[str, Any]:
    """One sequence per forward/backward, full logits: what a PEFT user writes first."""
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=1e-5)
    sequences = [
        (sequence, 1.0 if t % 2 else -1.0)
        for g, group in enumerate(groups)
        for t, trajectory in enumerate(group.trajectories)
        for sequence in tokenize_trajectory(
            trajectory, tokenizer, group_index=g, trajectory_index=t
        )
    ]
    total = sum(sum(s.trained[1:]) for s, _ in sequences)
    started = time.perf_counter()
    for sequence, advantage in sequences:
        ids = torch.tensor([sequence.token_ids], device="cuda")
        mask = torch.tensor([sequence.trained[1:]], device="cuda", dtype=torch.float32)
        logits = model(input_ids=ids).logits[:, :-1].float()
        logprobs = logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -(advantage * logprobs * mask).sum() / total
        loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()
    torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - started, "tokens": float(total)}


def measure(side: str, tokenizer: Any, groups: list[art.TrajectoryGroup]) -> dict[str, Any]:
    torch.cuda.empty_cache()
    model = create_peft_model(random_model(len(tokenizer)), art.dev.PeftArgs(), seed=0)
    torch.cuda.reset_peak_memory_stats()
    try:
        result = (ours if side == "ours" else plain)(model, tokenizer, groups)
        result["peak_gib"] = torch.cuda.max_memory_allocated() / 1024**3
    except torch.OutOfMemoryError:
        result = {"seconds": float("nan"), "tokens": float("nan"), "peak_gib": float("nan")}
        result["oom"] = True
    del model
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default="8x2048,8x4096,32x2048,32x4096")
    parser.add_argument(
        "--tokenizer",
        default=os.environ.get("ART_TOKENIZER_DIR"),
        help="a tokenizer directory (default: $ART_TOKENIZER_DIR, else the default model's; "
        "`make gpu-wheels` copies it into .gpu/tokenizer for a GPU machine without the model)",
    )
    parser.add_argument("--quick", action="store_true", help="one setting, 4x256")
    args = parser.parse_args()
    if args.quick:
        args.settings = "4x256"
    from transformers import AutoTokenizer

    if args.tokenizer is None:
        from art.runtime import models

        args.tokenizer = str(models.default_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    print(
        f"machine: {machine()}; model: random, Llama-3.2-1B decoder shape, vocab "
        f"{len(tokenizer)}, bf16; LoRA r=8 on 7 modules"
    )
    # CUDA's first kernels (and cuBLAS's heuristics) load on first use: warm both up.
    for side in ("ours", "plain"):
        measure(side, tokenizer, groups_of(tokenizer, 4, 256))
    for setting in args.settings.split(","):
        count, length = (int(part) for part in setting.split("x"))
        groups = groups_of(tokenizer, count, length)
        results = {side: measure(side, tokenizer, groups) for side in ("ours", "plain")}
        line = [f"{setting}:"]
        for side, result in results.items():
            if result.get("oom"):
                line.append(f"{side} OOM;")
            else:
                line.append(
                    f"{side} {result['peak_gib']:.2f} GiB, {result['seconds']:.1f} s "
                    f"({result['tokens']:.0f} tokens);"
                )
        if not any(r.get("oom") for r in results.values()):
            a, b = results["ours"], results["plain"]
            line.append(
                f"ours/plain memory {a['peak_gib'] / b['peak_gib']:.2f}x, "
                f"time {a['seconds'] / b['seconds']:.2f}x"
            )
        print(" ".join(line), flush=True)


if __name__ == "__main__":
    main()
