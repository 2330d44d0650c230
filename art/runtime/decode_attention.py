"""Attention for one-token decode steps on a CPU, registered with transformers.

A decode step asks attention for one query position per row over the row's cached keys.
Called as transformers calls it (one query position of every head), torch's SDPA on a
CPU paid a fixed cost per (row, head) far above this arithmetic (~1.3 ms a layer for 32
rows of the default model, torch 2.13), and transformers first copies the key/value heads
once per query group (`repeat_kv`) when a padding mask is given. Here the query heads
are grouped over their shared key/value head and the group stands as that head's query
positions (none causal to the keys): one call of the same fused kernel, 0.35-0.7x the
time of two matmuls and a softmax in float32 and 0.17-0.6x in bfloat16 (1-32 rows, 64-2048
positions, the default model's heads). `grouped_attention` is that call; the lean decode
step (`engines/transformers/lean_decode.py`) attends through it too.

Everything else (prefill, training, anything needing grad, dropout, or a model feature
such as attention sinks) goes to transformers' own SDPA function unchanged. Registered
through `AttentionInterface` / `AttentionMaskInterface`, transformers' extension points.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
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
    grouped = query.reshape(rows, kv_heads, heads // kv_heads, head_dim)
    mask = None
    if attention_mask is not None:
        mask = attention_mask[:, :, -1:, -key.shape[2] :].reshape(rows, 1, 1, -1)
        if mask.dtype != torch.bool:
            mask = mask.to(query.dtype)
    output = grouped_attention(grouped, key, value, mask, scaling)  # [rows, kv heads, groups, d]
    return output.reshape(rows, 1, heads, head_dim), None


def grouped_attention(
    grouped: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None = None,
) -> torch.Tensor:
    """One query position per row, its heads grouped over their key/value head: `grouped`
    [rows, kv heads, group, head dim] over `keys`/`values` [rows, kv heads, positions, head
    dim]; `mask` [rows, 1, 1, positions] is boolean (True where attended) or added to the
    scores (in the query's dtype). `scale` None: head dim ** -0.5."""
    return F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask, scale=scale)


def register() -> str:
    """Make `NAME` an attention implementation transformers models can be set to."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


__all__ = ["NAME", "decode_attention", "grouped_attention", "register"]
