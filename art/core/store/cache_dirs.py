"""Cache directories of the libraries a GPU run compiles and downloads with, as ART sets them.

`configure_model_cache_env` points Hugging Face, torch, Triton and vLLM caches at one
node-local root (ART's default `/tmp/art-cache`) unless a variable already names a place;
the compiled caches are kept per CUDA architecture (`TORCH_CUDA_ARCH_LIST`), since kernels
built for one GPU do not load on another. Nothing here is called by `art` itself: it is for
a launcher script that wants ART's layout before it imports those libraries.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from pathlib import Path

DEFAULT_CACHE_ROOT = Path("/tmp/art-cache")
# Shared filesystems on which many ranks reading and writing small cache files is slow.
NETWORK_FILESYSTEMS = frozenset(
    {"ceph", "cifs", "fuse.sshfs", "gpfs", "lustre", "nfs", "nfs4", "smb3", "weka"}
)
_ROOT_VARIABLE = "ART_MEGATRON_CACHE_ROOT"  # ART's name for the chosen root


def compiler_cache_root(
    cache_root: str | Path, environ: MutableMapping[str, str] | None = None
) -> Path:
    """`<cache_root>/compiled/<arch>`, `<arch>` from TORCH_CUDA_ARCH_LIST (or
    CUDA_ARCH_LIST) made safe as a directory name, "unknown" when neither is set."""
    env = os.environ if environ is None else environ
    arch = env.get("TORCH_CUDA_ARCH_LIST") or env.get("CUDA_ARCH_LIST") or "unknown"
    return Path(cache_root) / "compiled" / re.sub(r"[^A-Za-z0-9._-]+", "_", arch)


def _unescape_mount(field: str) -> str:
    return field.replace(r"\040", " ").replace(r"\134", "\\")


def cache_filesystem_type(path: str | Path) -> str | None:
    """The type of the filesystem holding `path` (the deepest mount point above it in
    /proc/mounts), or None where that cannot be read (not Linux)."""
    target = Path(path).expanduser().resolve()
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    best: tuple[int, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = Path(_unescape_mount(fields[1]))
        if target != mount and mount not in target.parents:
            continue
        if best is None or len(mount.parts) > best[0]:
            best = (len(mount.parts), fields[2])
    return None if best is None else best[1]


def network_cache_warning(path: str | Path) -> str | None:
    """A sentence saying `path` is on a network filesystem, or None where it is not."""
    filesystem = cache_filesystem_type(path)
    if filesystem not in NETWORK_FILESYSTEMS:
        return None
    return (
        f"{Path(path).expanduser()} is on {filesystem}; managed runtime installs and "
        "compilation caches should use fast node-local storage"
    )


def _choose(
    env: MutableMapping[str, str], name: str, default: Path, old_default: Path | None
) -> Path:
    """Keep `name`'s value unless unset, or equal to `old_default` (a value this function
    derived before from the root now being replaced); then use `default`."""
    current = env.get(name)
    path = Path(current).expanduser() if current else default.expanduser()
    if old_default is not None and path == old_default:
        path = default.expanduser()
    env[name] = str(path)
    return path


def configure_model_cache_env(
    environ: MutableMapping[str, str] | None = None, *, cache_root: str | Path | None = None
) -> Path:
    """Fill in the cache variables (XDG_CACHE_HOME, HF_HOME, HF_HUB_CACHE,
    HUGGINGFACE_HUB_CACHE, TRANSFORMERS_CACHE, TORCH_HOME, TORCH_EXTENSIONS_DIR,
    TORCHINDUCTOR_CACHE_DIR, TRITON_HOME, TRITON_CACHE_DIR, VLLM_CACHE_ROOT,
    VLLM_CONFIG_ROOT) under one root, keeping any a user set; return the root.

    The root is `cache_root`, else ART_MEGATRON_CACHE_ROOT, else XDG_CACHE_HOME, else
    /tmp/art-cache. Given `cache_root`, values still derived from the previous root
    move with it; values pointing elsewhere stay.
    """
    env = os.environ if environ is None else environ
    earlier_root_value = env.get(_ROOT_VARIABLE)
    earlier_root = (
        Path(earlier_root_value).expanduser() if earlier_root_value else DEFAULT_CACHE_ROOT
    )
    earlier_xdg = Path(env.get("XDG_CACHE_HOME") or earlier_root).expanduser()
    earlier_hf = Path(env.get("HF_HOME") or earlier_xdg / "huggingface").expanduser()
    earlier_hub = Path(
        env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or earlier_hf / "hub"
    ).expanduser()

    chosen = cache_root if cache_root is not None else earlier_root_value
    root = Path(chosen).expanduser() if chosen is not None else None
    if root is not None:
        env[_ROOT_VARIABLE] = str(root)
    moving = cache_root is not None

    def old(path: Path) -> Path | None:
        return path if moving else None

    xdg = _choose(env, "XDG_CACHE_HOME", root or DEFAULT_CACHE_ROOT, old(earlier_root))
    hf_home = _choose(env, "HF_HOME", xdg / "huggingface", old(earlier_xdg / "huggingface"))
    legacy_hub = env.get("HUGGINGFACE_HUB_CACHE")
    hub_default = hf_home / "hub"
    if legacy_hub and not (moving and Path(legacy_hub).expanduser() == earlier_hf / "hub"):
        hub_default = Path(legacy_hub).expanduser()
    hub = _choose(env, "HF_HUB_CACHE", hub_default, old(earlier_hf / "hub"))
    compiled = compiler_cache_root(xdg, env)
    earlier_compiled = compiler_cache_root(earlier_xdg, env)
    for name, default, earlier in (
        ("HUGGINGFACE_HUB_CACHE", hub, earlier_hf / "hub"),
        ("TRANSFORMERS_CACHE", hub, earlier_hub),
        ("TORCH_HOME", xdg / "torch", earlier_xdg / "torch"),
        (
            "TORCH_EXTENSIONS_DIR",
            compiled / "torch_extensions",
            earlier_compiled / "torch_extensions",
        ),
        ("TORCHINDUCTOR_CACHE_DIR", compiled / "torchinductor", earlier_compiled / "torchinductor"),
        ("TRITON_HOME", xdg, earlier_xdg),
        ("TRITON_CACHE_DIR", compiled / "triton", earlier_compiled / "triton"),
        ("VLLM_CACHE_ROOT", compiled / "vllm", earlier_compiled / "vllm"),
        ("VLLM_CONFIG_ROOT", xdg / "vllm_config", earlier_xdg / "vllm_config"),
    ):
        _choose(env, name, default, old(earlier))
    return root or xdg


__all__ = [
    "cache_filesystem_type",
    "compiler_cache_root",
    "configure_model_cache_env",
    "network_cache_warning",
]
