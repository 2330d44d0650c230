"""LocalBackend against llama.cpp, the sampler a CPU user would pick, in one run.

Completion tokens/s of the same prompts, token limit and sampling settings (temperature
1.0, no top-k, top-p or min-p, no repeat penalty) on both sides, at 1 request at a time
and at `--concurrency` requests in a closed loop:

- ours: the default model through LocalBackend's OpenAI endpoint (the model service in its
  child process), measured by `local_backend.py`'s own closed loop, the base model served
  (adapter off, as llama.cpp has none), in the dtype `auto` picks;
- llama.cpp: `llama-server --parallel N` (continuous batching behind an OpenAI-compatible
  endpoint), measured by the same loop, and `llama-cpp-python` in a process of its own at
  1 request at a time, both on the Q4_1 GGUF the default model ships as.

Both sides are held to AVX2 kernels whatever this CPU has: llama.cpp is compiled for
AVX2/FMA/F16C only (`make venv-llama`), and this script sets ATEN_CPU_CAPABILITY=avx2,
ONEDNN_MAX_CPU_ISA=AVX2, MKL_ENABLE_INSTRUCTIONS=AVX2 and FBGEMM_ENABLE_INSTRUCTIONS=AVX2
(unless already set) before torch loads, so `auto` picks fp32 as on an AVX2-only CPU.
The sides take turns in `--rounds` rounds, as in `local_backend.py`.

    make venv-llama                                # once: builds .venv-llama (10-20 minutes)
    python benchmarks/llama_cpp.py                 # the full run (~6 minutes on 2 idle cores)
    python benchmarks/llama_cpp.py --quick         # a smoke setting
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

# Read by torch, oneDNN, MKL and fbgemm when they load: set before the first import of torch.
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
os.environ.setdefault("MKL_ENABLE_INSTRUCTIONS", "AVX2")
os.environ.setdefault("FBGEMM_ENABLE_INSTRUCTIONS", "AVX2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import local_backend as bench  # this folder's whole-backend benchmark: figures, helpers
import torch
from openai import AsyncOpenAI
from support.llama_server import free_port, running

import art
from art.local import LocalBackend
from art.runtime import models

AVX2_KERNELS = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "FBGEMM_ENABLE_INSTRUCTIONS",
)
ROOT = Path(__file__).resolve().parent.parent
LLAMA_VENV = ROOT / ".venv-llama"
NOT_INSTALLED = (
    "llama.cpp peer not installed (no llama-server and llama-cpp-python in {venv}): "
    "`make venv-llama` builds them (llama.cpp compiled for AVX2, 10-20 minutes on 2 cores), "
    "then run this again. Nothing measured."
)


@dataclass(frozen=True)
class LlamaArgs:
    """What one run measures."""

    concurrency: int = 32  # concurrent requests of the closed loop, and llama-server's slots
    max_tokens: int = 64  # completion tokens per request (fewer where the model stops)
    seconds: float = 30.0  # measured wall time of each measurement, all rounds together
    warmup_seconds: float = 5.0  # unmeasured time before each round of a measurement
    rounds: int = 3  # the sides take turns, each measured `seconds / rounds` a turn
    threads: int = 0  # llama.cpp's threads; 0: torch's thread count, so both use the same
    slot_tokens: int = 512  # llama-server's context per slot (prompt + completion)
    llama_venv: Path = LLAMA_VENV


QUICK = LlamaArgs(concurrency=4, max_tokens=8, seconds=1.0, warmup_seconds=0.0, rounds=1)

# llama.cpp's own defaults filter (top-k 40, top-p 0.95, min-p 0.05); ours samples from the
# whole distribution at temperature 1.0, and so does llama.cpp with these.
SAMPLING = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0}


# --- llama.cpp ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaServerEndpoint:
    """llama-server seen as `local_backend.ours_throughput` sees a model: a client and the
    name to request, so both sides are measured by the same closed loop."""

    base_url: str
    name: str

    def openai_client(self) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=self.base_url, api_key="none", max_retries=0, timeout=600)

    def get_inference_name(self) -> str:
        return self.name


@contextlib.contextmanager
def llama_server(args: LlamaArgs, gguf: Path, threads: int) -> Iterator[LlamaServerEndpoint]:
    """`llama-server` on 127.0.0.1 with `args.concurrency` slots, until the block ends."""
    name = gguf.stem
    arguments = [
        "--model", str(gguf), "--alias", name,
        "--parallel", str(args.concurrency), "--cont-batching",
        "--ctx-size", str(args.concurrency * args.slot_tokens),
        "--threads", str(threads), "--threads-batch", str(threads),
        "--temp", "1.0", "--top-k", "0", "--top-p", "1.0", "--min-p", "0.0",
        "--repeat-penalty", "1.0",
    ]  # fmt: skip
    binary = args.llama_venv / "llama.cpp" / "llama-server"
    with running(binary, free_port(), arguments) as base_url:
        yield LlamaServerEndpoint(base_url, name)


# Run by .venv-llama's interpreter: llama-cpp-python, one chat completion at a time, in the
# same windows and counting as the closed loop at 1 request. Prints one JSON line.
_BINDING = """
import itertools, json, sys, time
import llama_cpp
job = json.loads(sys.argv[1])
llm = llama_cpp.Llama(model_path=job["gguf"], n_ctx=job["n_ctx"], n_threads=job["threads"],
                      n_threads_batch=job["threads"], seed=job["seed"], verbose=False)
prompts = itertools.cycle(job["prompts"])
def one():
    out = llm.create_chat_completion(messages=[{"role": "user", "content": next(prompts)}],
                                     max_tokens=job["max_tokens"], **job["sampling"])
    return out["usage"]["completion_tokens"]
deadline = time.perf_counter() + job["warmup_seconds"]
while time.perf_counter() < deadline:
    one()
counts, started = [], time.perf_counter()
while True:
    counts.append(one())
    elapsed = time.perf_counter() - started
    if elapsed >= job["seconds"]:
        break
print(json.dumps({"tokens_per_s": sum(counts) / elapsed, "requests": len(counts),
                  "mean_tokens": sum(counts) / len(counts), "version": llama_cpp.__version__,
                  "system_info": llama_cpp.llama_print_system_info().decode().strip()}))
"""


def binding_throughput(
    args: LlamaArgs, gguf: Path, threads: int, turn: Any, seed: int
) -> tuple[Any, dict[str, str]]:
    """llama-cpp-python at 1 request at a time, in a process of its own."""
    job = {
        "gguf": str(gguf),
        "n_ctx": args.slot_tokens,
        "threads": threads,
        "seed": seed,
        "prompts": bench.THROUGHPUT_PROMPTS,
        "max_tokens": turn.max_tokens,
        "sampling": SAMPLING,
        "warmup_seconds": turn.warmup_seconds,
        "seconds": turn.seconds,
    }
    python = args.llama_venv / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", _BINDING, json.dumps(job)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"llama-cpp-python failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    about = {"version": result["version"], "system_info": result["system_info"]}
    return bench.Throughput(
        result["tokens_per_s"], result["requests"], result["mean_tokens"]
    ), about


# --- the run ------------------------------------------------------------------------------


def cpu_flags() -> str:
    """This CPU's model name and whether it has the two flags that decide the kernels."""
    flags: set[str] = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return ", ".join(
        f"{flag} {'yes' if flag in flags else 'no'}" for flag in ("avx2", "avx512_bf16")
    )


async def measure(args: LlamaArgs) -> tuple[dict[str, Any], dict[str, str]]:
    c = args.concurrency
    threads = args.threads or torch.get_num_threads()
    gguf = models._gguf_file()
    ours_args = replace(
        bench.BenchArgs(),
        concurrency=c,
        max_tokens=args.max_tokens,
        seconds=args.seconds / args.rounds,
        warmup_seconds=args.warmup_seconds,
        rounds=1,
        serve_base=True,  # the base weights, as llama.cpp samples them: no adapter
    )
    rounds: dict[str, list[Any]] = {}
    about: dict[str, str] = {}
    with (
        tempfile.TemporaryDirectory(prefix="art-bench-llama-") as path,
        llama_server(args, gguf, threads) as server,
    ):
        backend = LocalBackend(path=path)  # the model service in its own process, the default
        try:
            print(f"loading {ours_args.base_model} into LocalBackend ...", flush=True)
            model = art.TrainableModel(
                name="bench", project="bench", base_model=ours_args.base_model
            )
            await model.register(backend)
            # The same closed loop for both endpoints: llama-server quacks like a model.
            peer = cast(art.TrainableModel, server)
            peer_args = replace(ours_args, serve_base=False)  # request the server's alias
            for index in range(args.rounds):
                print(f"round {index + 1}/{args.rounds}: ours @1 ...", flush=True)
                rounds.setdefault("ours@1", []).append(
                    await bench.ours_throughput(model, ours_args, 1)
                )
                print("  llama-cpp-python @1 ...", flush=True)
                result, about = await asyncio.to_thread(
                    binding_throughput, args, gguf, threads, ours_args, index
                )
                rounds.setdefault("binding@1", []).append(result)
                print("  llama-server @1 ...", flush=True)
                rounds.setdefault("server@1", []).append(
                    await bench.ours_throughput(peer, peer_args, 1)
                )
                print(f"  ours @{c} ...", flush=True)
                rounds.setdefault(f"ours@{c}", []).append(
                    await bench.ours_throughput(model, ours_args, c)
                )
                print(f"  llama-server @{c} ...", flush=True)
                rounds.setdefault(f"server@{c}", []).append(
                    await bench.ours_throughput(peer, peer_args, c)
                )
        finally:
            await backend.close()
    about |= {"threads": str(threads), "gguf": gguf.name}
    return {key: bench._combined(results) for key, results in rounds.items()}, about


def report(args: LlamaArgs, results: dict[str, Any], about: dict[str, str]) -> None:
    c = args.concurrency
    forced = " ".join(f"{name}={os.environ.get(name, '')}" for name in AVX2_KERNELS)
    print()
    print(f"machine: {bench.machine()}")
    print(f"  CPU flags: {cpu_flags()}")
    print(
        f"  ours: ATen kernels {torch.backends.cpu.get_cpu_capability()} ({forced}), "
        f"dtype {str(models.torch_dtype('auto')).removeprefix('torch.')} (auto), "
        f"{torch.get_num_threads()} torch threads"
    )
    print(
        f"  llama.cpp: llama-cpp-python {about['version']}, {about['threads']} threads, "
        f"kernels: {about['system_info']}"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    print(f"  load average at the end: {load:.1f} (other work on this CPU skews every figure)")
    print(
        f"weights: llama.cpp samples the 4-bit weights of {about['gguf']} as shipped; "
        "ours samples fp32 weights dequantized from the same file"
    )
    print()
    print(
        f"completion tokens/s, temperature 1.0, no top-k/top-p/min-p, max_tokens "
        f"{args.max_tokens}, {args.seconds:g}s measured in {args.rounds} rounds taken in turn, "
        f"each after {args.warmup_seconds:g}s warmup"
    )
    print(f"  {'':<44} {'tokens/s':>9} {'requests':>9} {'tokens/request':>15}")
    names = {
        "ours@1": "ours @1 (LocalBackend endpoint, sequential)",
        "binding@1": "llama-cpp-python @1 (in its process)",
        "server@1": "llama-server @1 (sequential requests)",
        f"ours@{c}": f"ours @{c} (LocalBackend endpoint, closed loop)",
        f"server@{c}": f"llama-server @{c} (--parallel {c}, closed loop)",
    }
    for key, name in names.items():
        result = results[key]
        print(
            f"  {name:<44} {result.tokens_per_s:>9.1f} {result.requests:>9d} "
            f"{result.mean_tokens:>15.1f}"
        )
    tps = {key: result.tokens_per_s for key, result in results.items()}
    print(bench._ratio_line("ours@1 / llama-server@1", tps["ours@1"] / tps["server@1"]))
    print(bench._ratio_line("ours@1 / llama-cpp-python@1", tps["ours@1"] / tps["binding@1"]))
    print(bench._ratio_line(f"ours@{c} / llama-server@{c}", tps[f"ours@{c}"] / tps[f"server@{c}"]))


def parse_args() -> LlamaArgs:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a tiny smoke setting")
    defaults = LlamaArgs()
    for name in ("concurrency", "max_tokens", "seconds", "warmup_seconds", "rounds", "threads"):
        kind = type(getattr(defaults, name))
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=kind,
            help=f"default {getattr(defaults, name)} ({getattr(QUICK, name)} with --quick)",
        )
    parser.add_argument("--llama-venv", type=Path, help=f"default {LLAMA_VENV}")
    parsed = parser.parse_args()
    if parsed.rounds is not None and parsed.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {parsed.rounds}")
    given = {
        name: value for name, value in vars(parsed).items() if name != "quick" and value is not None
    }
    return replace(QUICK if parsed.quick else defaults, **given)


def main() -> None:
    args = parse_args()
    missing = [
        path
        for path in (
            args.llama_venv / "bin" / "python",
            args.llama_venv / "llama.cpp" / "llama-server",
        )
        if not path.is_file()
    ]
    if missing:
        print(NOT_INSTALLED.format(venv=args.llama_venv))
        return
    results, about = asyncio.run(measure(args))
    report(args, results, about)


if __name__ == "__main__":
    main()
