"""Attention for one-token decode steps on a CPU, registered with transformers.

A decode step asks attention for one query position per row over the row's cached keys.
torch's SDPA kernels on a CPU pay a fixed cost per (row, head) that is far larger than
this arithmetic (~1.3 ms a layer for 32 rows of the default model against ~0.2 ms for
two batched matmuls), and transformers first copies the key/value heads once per query
group (`repeat_kv`) when a padding mask is given. Here the query heads are grouped over
their shared key/value head and attention is two matmuls and a softmax.

Everything else (prefill, training, anything needing grad, dropout, or a model feature
such as attention sinks) goes to transformers' own SDPA function unchanged. Registered
through `AttentionInterface` / `AttentionMaskInterface`, transformers' extension points.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "art_decode"
_UNSUPPORTED = ("s_aux", "sinks", "softcap", "position_bias", "cache")


def decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query [b, heads, q, d], key/value [b, kv heads, k, d]."""
    rows, heads, positions, head_dim = query.shape
    kv_heads = key.shape[1]
    if (
        positions != 1
        or torch.is_grad_enabled()
        or dropout
        or heads % kv_heads
        or query.device.type != "cpu"
        or any(kwargs.get(name) is not None for name in _UNSUPPORTED)
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = scaling if scaling is not None else head_dim**-0.5
    grouped = query.reshape(rows, kv_heads, heads // kv_heads, head_dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float().mul_(scale)
    if attention_mask is not None:
        mask = attention_mask[:, :, -1:, -key.shape[2] :].reshape(rows, 1, 1, -1)
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask)
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    output = torch.matmul(weights, value)  # [rows, kv heads, groups, d]
    return output.reshape(rows, 1, heads, head_dim), None


def register() -> str:
    """Make `NAME` an attention implementation transformers models can be set to."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


__all__ = ["NAME", "decode_attention", "register"]
