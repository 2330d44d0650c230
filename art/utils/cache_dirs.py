"""ART's `art.utils.cache_dirs`: Hugging Face, torch, Triton and vLLM caches under one root."""

from ..core.store.cache_dirs import (
    cache_filesystem_type,
    compiler_cache_root,
    configure_model_cache_env,
    network_cache_warning,
)

__all__ = [
    "cache_filesystem_type",
    "compiler_cache_root",
    "configure_model_cache_env",
    "network_cache_warning",
]
