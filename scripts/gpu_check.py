"""`make gpu-check`: the CUDA-only tests and the CUDA benchmarks in one go (the sampler
against `generate`, the training step against the plain PEFT loop), with a summary of
what ran and what skipped (and why). Without CUDA it says so and skips everything.

    python scripts/gpu_check.py                    # run (make gpu-check)
    python scripts/gpu_check.py --prepare .gpu     # make gpu-wheels: for a GPU machine
                                                   # with no network, see below

A GPU machine with no network but its own torch, transformers and peft needs the rest of
what the checks import: `--prepare DIR` downloads those wheels (for `--python-version`)
into DIR/wheels, writes DIR/requirements.txt, and copies the default model's tokenizer
into DIR/tokenizer (the CUDA benchmark's models are randomly initialised, so no weights
travel). `make gpu-check` installs them from there first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What the checks import that a CUDA image holding torch, transformers, peft, safetensors,
# pyarrow, tqdm, pytest and pytest-timeout may lack, with their own requirements (torch
# and transformers are requirements of none); versions from constraints.txt.
WHEELS = (
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "openai",
    "distro",
    "jiter",
    "sniffio",
    "fastapi",
    "starlette",
    "uvicorn",
    "gguf",
    "llguidance",
    "pytest-asyncio",
)
# The CUDA benchmark's setting: 8 agent trajectories of ~4k tokens on a 1B shape.
BENCH_SETTINGS = "8x4096"


def prepare(directory: Path, python_version: str) -> None:
    wheels = directory / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            "--python-version",
            python_version,
            "-c",
            str(ROOT / "constraints.txt"),
            "-d",
            str(wheels),
            *WHEELS,
        ],
        check=True,
    )
    (directory / "requirements.txt").write_text("\n".join(WHEELS) + "\n")
    from art.runtime.models import default_model_dir

    tokenizer = directory / "tokenizer"
    tokenizer.mkdir(exist_ok=True)
    for source in default_model_dir().iterdir():
        if source.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy2(source, tokenizer / source.name)
    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    print(
        f"{directory}: {len(list(wheels.iterdir()))} wheels and a tokenizer, {size / 2**20:.1f} MiB"
    )


def run() -> int:
    import torch

    if not torch.cuda.is_available():
        print(f"gpu-check: no CUDA GPU here (torch {torch.__version__}): every check skipped")
        return 0
    print(f"gpu-check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    tokenizer = ROOT / ".gpu" / "tokenizer"
    if tokenizer.is_dir():
        env["ART_TOKENIZER_DIR"] = str(tokenizer)
    results: list[tuple[str, int, float]] = []

    def step(name: str, command: list[str], limit_s: float) -> None:
        print(f"\n=== {name}: {' '.join(command)}", flush=True)
        start = time.monotonic()
        try:
            code = subprocess.run(command, cwd=ROOT, env=env, timeout=limit_s).returncode
        except subprocess.TimeoutExpired:
            print(f"=== {name}: stopped after {limit_s:.0f} s", flush=True)
            code = 124
        results.append((name, code, time.monotonic() - start))

    # Only the modules holding CUDA tests are collected: the others import libraries (Ray,
    # LangGraph, MCP, ...) a GPU machine's image need not have.
    modules = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if "pytest.mark.cuda" in path.read_text()
    )
    step(
        "CUDA tests",
        [
            *(sys.executable, "-m", "pytest", "-m", "cuda", "-rs", "-p", "no:cacheprovider"),
            *("--timeout", "150", *modules),  # a hung test fails alone
        ],
        limit_s=240,
    )
    step(
        "CUDA sampler benchmark",
        [sys.executable, "benchmarks/sampler_cuda.py", "--endpoint"],
        limit_s=200,
    )
    step(
        "CUDA training benchmark",
        [sys.executable, "benchmarks/train_memory_cuda.py", "--settings", BENCH_SETTINGS],
        limit_s=100,
    )
    print("\ngpu-check summary (the CUDA tests' skips and their reasons are listed above):")
    for name, code, seconds in results:
        print(f"  {name}: {'passed' if code == 0 else f'FAILED (exit {code})'} in {seconds:.0f} s")
    return max(code for _, code, _ in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", type=Path, help="download what a GPU machine lacks here")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    args = parser.parse_args()
    if args.prepare is not None:
        prepare(args.prepare, args.python_version)
        return
    sys.exit(run())


if __name__ == "__main__":
    main()
