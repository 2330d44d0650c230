"""The sampling copy's linear layers as oneDNN packed weights (float32, on a CPU).

A float32 decode step multiplies through oneDNN (`lean_decode.py`), which by default
takes a weight in its plain row-major layout and re-blocks it as it goes, on every call.
`torch.ops.mkldnn._reorder_linear_weight` blocks a weight once, the way torch's inductor
prepares a linear layer's weight ahead of time; `_linear_pointwise` then takes the
blocked weight for any number of rows. On an AMD EPYC with AVX2 kernels (2 cores, torch
2.13, the default model's 30 layers, LM head dense) a whole lean decode step took 63.8 ms
against 76.3 at 32 rows, 31.2 against 36.1 at 8 and 106.5 against 114.5 at 64, and 23.1
against 20.5 at one row, where the extra calls below cost more than the blocking saves
(benchmarks/RESULTS.md, 2026-12-01).

A blocked weight is an opaque oneDNN tensor: it cannot be sliced or viewed, so the
decoder cannot fuse q/k/v or gate/up into one buffer of module views as it does with
plain weights, and keeping both layouts would hold the copy's weights twice. So each
linear layer of the copy becomes a `PackedLinear` holding its own blocked weight: prefill
runs the modules, the lean step calls the same weights one projection at a time
(`packed_linear`), and a merge (`merged.py`) blocks W0 + delta afresh. The LM head stays
plain: it is the embedding table's tensor, which lookups need row-major.

Used where the lean step would multiply every row count through oneDNN anyway
(`lean_decode.packs`); on a GPU, in bfloat16, or where torch's BLAS takes the fewest rows,
the copy keeps plain weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# The rows a weight is blocked for: a decode step's batch; any row count may use it.
_BLOCKED_FOR_ROWS = 32
Weights = torch.Tensor | tuple[torch.Tensor, ...]


def block(weight: torch.Tensor) -> torch.Tensor:
    """`weight` ([out, in], float32, CPU) as oneDNN's blocked weight."""
    blocked: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(
        weight.detach().contiguous(), _BLOCKED_FOR_ROWS
    )
    return blocked


class PackedLinear(torch.nn.Module):
    """A frozen `nn.Linear` whose weight is held blocked for oneDNN (`block`)."""

    blocked: torch.Tensor
    bias: torch.nn.Parameter | None

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.register_buffer("blocked", block(linear.weight), persistent=False)
        self.bias = linear.bias

    def load(self, weight: torch.Tensor) -> None:
        """Hold `weight` ([out, in], plain layout) from now on, written into the blocked
        tensor in place: the lean step holds that tensor, not this module."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(
                f"weight of shape {tuple(weight.shape)} for a layer of "
                f"({self.out_features}, {self.in_features})"
            )
        self.blocked.copy_(block(weight))

    def nbytes(self) -> int:
        return self.in_features * self.out_features * 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.blocked, self.bias)


def onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear` through oneDNN, on a plain weight as it is or a blocked one (`block`):
    the op torch's inductor lowers CPU linears to, the one torch exposes for it."""
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [None], "")
    return out


def packed_linear(x: torch.Tensor, weights: Weights, bias: Any = None) -> torch.Tensor:
    """`x` times one weight (blocked or plain) or the concatenated outputs of several
    (`bias` then one per weight, or None): the lean step's linear for a packed copy."""
    if isinstance(weights, torch.Tensor):
        return onednn_linear(x, weights, bias)
    biases: Sequence[torch.Tensor | None] = bias if bias is not None else [None] * len(weights)
    return torch.cat(
        [packed_linear(x, weight, part) for weight, part in zip(weights, biases, strict=True)],
        dim=-1,
    )


def pack(model: Any) -> int:
    """Replace every `nn.Linear` of `model` but its LM head by a `PackedLinear`; the number
    replaced. `model` must be float32, on a CPU, and take no gradient."""
    head = model.get_output_embeddings()
    replaced = 0
    for name, module in list(model.named_modules()):
        if type(module) is torch.nn.Linear and module is not head:
            weight = module.weight
            if weight.dtype != torch.float32 or weight.device.type != "cpu":
                raise ValueError(f"{name}: a {weight.dtype} weight on {weight.device}")
            model.set_submodule(name, PackedLinear(module))
            replaced += 1
    return replaced


def packed_bytes(model: Any) -> int:
    """The bytes `model`'s `PackedLinear` layers hold (their blocked weights)."""
    return sum(m.nbytes() for m in model.modules() if isinstance(m, PackedLinear))


__all__ = ["PackedLinear", "block", "onednn_linear", "pack", "packed_bytes", "packed_linear"]
