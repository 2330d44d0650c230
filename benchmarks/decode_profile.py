"""Where a decode step's time goes on this CPU: the engine against its own matmul floor.

One in-process LocalBackend serves the default model (as `local_backend.py` runs it, in
the dtype `auto` picks here) and `--concurrency` requests run in a closed loop through its
OpenAI endpoint. Measured in one run:

1. completion tokens/s of that loop, and of the same loop under torch's profiler;
2. the profile by op of the engine's torch thread (where every decode step runs): each
   op's self time, grouped (matmuls, attention, sampling, elementwise, copies), and how
   much of the wall time no torch op accounts for (that thread's Python: the decode loop,
   the scheduler; and its waits for requests, which the HTTP side renders and parses);
3. the floor: the matmuls of one decode step alone (every layer's fused q/k/v, o,
   gate/up and down projections at `--concurrency` rows, and the LM head), timed in a
   loop on the same weights through the library the engine multiplies with (in float32,
   oneDNN where torch has it, torch's BLAS at 1-2 rows where that times clearly faster,
   or weights packed ahead for oneDNN or MKL where the engine's copy packs them;
   torch's BLAS is timed beside it), as tokens/s. The ratio
   of (1) to it is how much of what this CPU's GEMM allows the engine reaches.

    python benchmarks/decode_profile.py            # ~2 minutes on 2 cores
    python benchmarks/decode_profile.py --quick    # a smoke setting
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import local_backend as bench  # this folder's whole-backend benchmark: figures, helpers
import torch
import torch.nn.functional as F

import art
from art.local import LocalBackend
from art.runtime import models
from art.runtime.engines.transformers import lean_decode, packed

# The figures and helpers of the whole-backend benchmark (this folder is first on sys.path).

# Op name -> group, by the first pattern it contains.
GROUPS = (
    (
        "matmul",
        (
            "aten::mm",
            "aten::addmm",
            "aten::mv",  # one bf16 row (lean_decode._bf16_linear)
            "aten::addmv",
            "aten::bmm",
            "aten::matmul",
            "aten::linear",
            "mkldnn::_linear_pointwise",
            "mkl::_mkl_linear",  # weights packed for MKL (packed.py)
        ),
    ),
    ("attention", ("scaled_dot_product", "aten::_softmax", "aten::softmax")),
    ("sampling", ("multinomial", "aten::exponential", "aten::topk", "aten::sort", "argmax")),
    (
        "copies and layout",
        (
            "aten::copy_",
            "aten::cat",
            "aten::clone",
            "aten::contiguous",
            "aten::index",
            "aten::to",
            "aten::_to_copy",
            "aten::empty",
        ),
    ),
)


def group_of(name: str) -> str:
    for group, patterns in GROUPS:
        if any(pattern in name for pattern in patterns):
            return group
    return "elementwise and other ops"


def step_matmul_floor(
    base_model: str,
    dtype: str,
    rows: int,
    repeats: int,
    linear: Any = F.linear,
    packing: packed.Packing | None = None,
) -> float:
    """Tokens/s if a decode step were only its matmuls: `rows` rows through every weight
    of the model once (fused as the engine fuses them) and the LM head, multiplied by
    `linear` (F.linear: torch's BLAS), or packed ahead for `packing`'s library as the
    engine's copy packs them (`packed.py`)."""
    model, _ = models.load(models.resolve(base_model), dtype)
    weights: list[torch.Tensor] = []
    for layer in model.get_decoder().layers:
        attention, mlp = layer.self_attn, layer.mlp
        weights.append(
            torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])
        )
        weights.append(attention.o_proj.weight)
        weights.append(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        weights.append(mlp.down_proj.weight)
    weights.append(model.get_output_embeddings().weight)
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights}
    products: list[Callable[[], torch.Tensor]] = [
        functools.partial(linear, inputs[w.shape[1]], w) for w in weights
    ]
    if packing is not None:
        products = [
            functools.partial(packed.block(w, packing).linear, inputs[w.shape[1]]) for w in weights
        ]
    with torch.no_grad():
        for product in products:  # warm the kernels and caches
            product()
        started = time.perf_counter()
        for _ in range(repeats):
            for product in products:
                product()
        elapsed = time.perf_counter() - started
    return rows * repeats / elapsed


def engine_gemm(base_model: str) -> tuple[Any, packed.Packing | None]:
    """The linear the engine's decode steps multiply with here (`LeanDecoder` picks it on
    the model's own weights: in float32, oneDNN or BLAS by row count; see lean_decode.py),
    and how its sampling copy packs its layers (`lean_decode.packs`), or None."""
    model, _ = models.load(models.resolve(base_model), "auto")
    packing = lean_decode.packs(model)
    decoder = lean_decode.LeanDecoder.of(model)
    return (decoder.linear if decoder is not None else F.linear), packing


async def measure(args: Any, seconds: float, profile: bool) -> tuple[float, Any]:
    with tempfile.TemporaryDirectory(prefix="art-decode-profile-") as path:
        backend = LocalBackend(path=path, in_process=True)
        try:
            model = art.TrainableModel(name="profile", project="bench", base_model=args.base_model)
            await model.register(backend)
            await bench.ours_throughput(model, replace(args, seconds=1.0, warmup_seconds=0.0), 2)
            run = replace(args, seconds=seconds)
            if not profile:
                return (
                    await bench.ours_throughput(model, run, args.concurrency)
                ).tokens_per_s, None
            # The profiler records the ops of the thread that starts it: the engine's.
            engine_thread = backend._model_service()._torch  # type: ignore[union-attr]
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            engine_thread.run(prof.start)
            started = time.perf_counter()
            result = await bench.ours_throughput(model, run, args.concurrency)
            wall = time.perf_counter() - started
            engine_thread.run(prof.stop)
            return result.tokens_per_s, (prof, wall)
        finally:
            await backend.close()


def report_profile(prof: Any, wall: float) -> list[str]:
    by_group: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        self_s = event.self_cpu_time_total / 1e6
        by_group[group_of(event.key)] += self_s
        by_op[event.key] += self_s
    total = sum(by_group.values())
    lines = [
        f"  the engine thread's torch ops: {total:.1f} s of {wall:.1f} s wall "
        f"({100 * total / wall:.0f}%; the rest is its Python and its waits)"
    ]
    for group, seconds in sorted(by_group.items(), key=lambda item: -item[1]):
        lines.append(f"    {group:<28} {seconds:7.2f} s  {100 * seconds / total:5.1f}%")
    lines.append("  the ten ops with the most self time:")
    for op, seconds in sorted(by_op.items(), key=lambda item: -item[1])[:10]:
        lines.append(f"    {op:<40} {seconds:7.2f} s")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a smoke setting")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=20.0)
    options = parser.parse_args()
    args = replace(
        bench.BenchArgs(),
        concurrency=options.concurrency,
        max_tokens=options.max_tokens,
        seconds=options.seconds,
        warmup_seconds=2.0,
    )
    repeats = 20
    if options.quick:
        args = replace(args, concurrency=4, max_tokens=8, seconds=1.0, warmup_seconds=0.0)
        repeats = 2
    dtype = models.torch_dtype("auto")  # what LocalBackend picks on this CPU
    plain, _ = asyncio.run(measure(args, args.seconds, profile=False))
    profiled, (prof, wall) = asyncio.run(measure(args, args.seconds, profile=True))
    # The floor multiplies as the engine's decode steps do; torch's BLAS is shown beside it.
    linear, packing = engine_gemm(args.base_model)
    gemm = lean_decode.gemm_name(linear)
    if packing is not None:
        gemm = f"{packing}, on weights packed ahead"
    blas_floor = step_matmul_floor(args.base_model, "auto", args.concurrency, repeats)
    floor = blas_floor
    if gemm != "blas":
        floor = step_matmul_floor(
            args.base_model, "auto", args.concurrency, repeats, linear, packing
        )
    print(f"machine: {bench.machine()}; dtype {dtype}; decode GEMMs: {gemm}")
    print(f"decode at {args.concurrency} concurrent requests, {args.max_tokens} tokens each:")
    print(f"  ours (LocalBackend, endpoint)       {plain:8.1f} tokens/s")
    print(f"  ours under the profiler             {profiled:8.1f} tokens/s")
    print(f"  matmul floor (the step's GEMMs)     {floor:8.1f} tokens/s  ({gemm})")
    if gemm != "blas":
        print(f"  the same GEMMs through torch's BLAS {blas_floor:8.1f} tokens/s")
    print(bench._ratio_line("ours / matmul floor", plain / floor))
    for line in report_profile(prof, wall):
        print(line)


if __name__ == "__main__":
    main()
