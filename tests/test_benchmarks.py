"""Each benchmark's `--quick` setting runs to its printed report, as a reader starts it.

A quick run's numbers are noise, so none is checked; the lines a reader relies on (the
machine line, the table, the ratio) are, and the exit code. A benchmark that rots (an
import path moved, a helper's signature changed) fails here, in `make test`.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import one_at_a_time

from art.runtime.engines.vllm.server import INSTALL_HINT, find_vllm_python
from art.runtime.trainer.unsloth_trainer import INSTALL_HINT as UNSLOTH_HINT
from art.runtime.trainer.unsloth_trainer import find_unsloth_python

pytestmark = pytest.mark.model  # loads the default model or starts a model service

ROOT = Path(__file__).resolve().parent.parent

needs_vllm = pytest.mark.skipif(
    find_vllm_python() is None, reason=f"no vLLM environment: {INSTALL_HINT}"
)
needs_trl = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None,
    reason="TRL, the GRPO peer, is not installed: pip install -c constraints.txt -e '.[bench]'",
)
needs_unsloth = pytest.mark.skipif(
    find_unsloth_python() is None, reason=f"no Unsloth environment: {UNSLOTH_HINT}"
)
# benchmarks/llama_cpp.py without `make venv-llama` says how to build it and measures
# nothing; with it, the whole report.
LLAMA_VENV = ROOT / ".venv-llama"
llama_ready = (LLAMA_VENV / "bin" / "python").is_file() and (
    LLAMA_VENV / "llama.cpp" / "llama-server"
).is_file()
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="a CUDA benchmark: no CUDA here"
)

# (script, options after --quick, lines its output must hold), one entry per run.
RUNS = [
    pytest.param(
        "client_pool",
        [],
        ["machine: ", "AsyncOpenAI(), the SDK's own client", "ours / the SDK's own client"],
        id="client_pool",
    ),
    pytest.param(
        "decode_profile",
        [],
        # The profile's op list, not an op's name: that depends on the CPU (`aten::mm`
        # through torch's BLAS, `mkldnn::_linear_pointwise` on weights packed for oneDNN).
        [
            "machine: ",
            "matmul floor (the step's GEMMs)",
            "ours / matmul floor",
            "the ten ops with the most self time:",
        ],
        id="decode_profile",
    ),
    pytest.param(
        "engines",
        [],
        [
            "machine: ",
            "vLLM engine @1",
            "/ generate batch @",
            "vllm / transformers seconds per step",
        ],
        marks=[needs_vllm, pytest.mark.timeout(1200)],  # vLLM's start alone takes minutes here
        id="engines",
    ),
    pytest.param(
        "local_backend",
        ["--parts", "rollout"],
        ["machine: ", "HF generate batch @", "ours@1 / generate@1"],
        id="local_backend-rollout",
    ),
    pytest.param(
        "local_backend",
        ["--parts", "grpo"],
        ["machine: ", "GRPO step: ", "ours / TRL seconds per step"],
        marks=needs_trl,
        id="local_backend-grpo",
    ),
    pytest.param(
        "llama_cpp",
        [],
        (
            ["machine: ", "4-bit weights", "llama-server @4", "ours@4 / llama-server@4"]
            if llama_ready
            else ["`make venv-llama` builds them", "Nothing measured."]
        ),
        id="llama_cpp",
    ),
    pytest.param(
        "load",
        [],
        ["machine: ", "with vanishing clients: 6 reading clients, 0 failed", "p50 ratio"],
        id="load",
    ),
    pytest.param(
        "pipeline",
        [],
        ["machine: ", "reward per step: ", "pipeline speed-up (sync seconds / pipeline seconds)"],
        id="pipeline",
    ),
    pytest.param(
        "ray_replicas",
        [],
        ["machine: ", "| RayBackend, 2 replicas |", "| **2 replicas / 1 replica** |"],
        id="ray_replicas",
    ),
    pytest.param(
        "ruler_agreement",
        ["--rubric", "task"],
        [
            "machine: ",
            "judge: openai/",
            "### arithmetic (the demo's task): 1 groups of 2, hand-scored; task rubric",
            "### tool use (weather, orders, currency): 1 groups of 2, hand-scored; task rubric",
            "| RULER |",
            "| pointwise (same judge) |",
            "RULER / random scorer: ",
        ],
        id="ruler_agreement",
    ),
    pytest.param(
        "ruler_learns",
        ["--rubric", "task"],
        [
            "machine: ",
            "judge: openai/",
            "RULER's rubric: task",
            "| RULER | 0 |",
            "| hand | 0 |",
            "| random | 0 |",
            "RULER: mean rise ",
        ],
        id="ruler_learns",
    ),
    pytest.param(
        "sampler_fidelity",
        [],
        ["machine: ", "  modules ", "  merged "],
        id="sampler_fidelity",
    ),
    pytest.param(
        "soak",
        [],
        [
            "machine: ",
            "requests in ",
            " 0 failed",
            "| end (idle) |",
            "rows and batch KV freed once idle: yes",
            "RSS not judged in --quick",
        ],
        id="soak",
    ),
    pytest.param(
        "sft",
        [],
        # Without TRL the script runs our side and prints why TRL's was not measured, on
        # the same lines: ours is smoke-tested either way.
        [
            "machine: ",
            "SFT: ",
            "ours PeftTrainer",
            "TRL SFTTrainer",
            "ours / TRL tokens per second",
        ],
        id="sft",
    ),
    pytest.param(
        "structured_output",
        [],
        ["machine: ", "32 rows: ", "constrained / unconstrained: "],
        id="structured_output",
    ),
    pytest.param(  # the synthesized trajectories run in train_memory-unsloth
        "train_memory",
        ["--agent", "langgraph"],
        ["machine: ", "4 x 64 tokens: ", "completion_tokens=", "peak_rss_gb=", "tree_peak_pss_gb="],
        id="train_memory-langgraph",
    ),
    pytest.param(
        "train_memory",
        ["--peer", "unsloth"],
        ["machine: ", "4 x 64 tokens: trainer=unsloth", "trainer_peak_rss_gb="],
        marks=needs_unsloth,
        id="train_memory-unsloth",
    ),
    pytest.param(
        "sampler_cuda",
        [],
        ["machine: ", "8 rows: generate ", "ours / generate ", "graphed static step "],
        marks=[needs_cuda, pytest.mark.cuda],
        id="sampler_cuda",
    ),
    pytest.param(
        "train_memory_cuda",
        [],
        ["machine: ", "4x256: ", "ours/plain memory "],
        marks=[needs_cuda, pytest.mark.cuda],
        id="train_memory_cuda",
    ),
]


def run_quick(script: str, *options: str) -> str:
    """`python benchmarks/<script>.py --quick ...` in a child process; its stdout."""
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    # On a shared CPU torch's spinning OpenMP threads make decoding tens of times slower
    # (benchmarks/README.md); one thread keeps a smoke run in seconds. A caller may override.
    env.setdefault("OMP_NUM_THREADS", "1")
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), "--quick", *options],
        capture_output=True,
        text=True,
        timeout=1100,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout


# The engines benchmark starts vLLM, ray_replicas a Ray cluster: one of each at a time.
LOCKS = {"engines": "vllm", "ray_replicas": "ray"}


@pytest.mark.parametrize(("script", "options", "expected"), RUNS)
def test_the_quick_setting_runs_to_its_report(
    script: str, options: list[str], expected: list[str]
) -> None:
    with one_at_a_time(LOCKS.get(script, script)):
        output = run_quick(script, *options)
    missing = [line for line in expected if line not in output]
    assert not missing, f"{missing} not in the output of {script}.py --quick:\n{output[-3000:]}"


def test_every_benchmark_has_a_quick_run_here() -> None:
    scripts = {path.stem for path in (ROOT / "benchmarks").glob("*.py")}
    covered = {param.values[0] for param in RUNS}
    assert scripts == covered
