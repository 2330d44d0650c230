"""The sampling copy's linear layers as weights packed ahead: oneDNN's or MKL's (float32, CPU).

A float32 decode step multiplies through oneDNN (`lean_decode.py`), which by default
takes a weight in its plain row-major layout and re-blocks it as it goes, on every call.
`torch.ops.mkldnn._reorder_linear_weight` blocks a weight once, the way torch's inductor
prepares a linear layer's weight ahead of time; `_linear_pointwise` then takes the
blocked weight for any number of rows. On an AMD EPYC with AVX2 kernels (2 cores, torch
2.13, the default model's 30 layers, LM head dense) a whole lean decode step took 63.8 ms
against 76.3 at 32 rows, 31.2 against 36.1 at 8 and 106.5 against 114.5 at 64, and 23.1
against 20.5 at one row, where the extra calls below cost more than the blocking saves
(benchmarks/RESULTS.md, 2026-12-01).

A blocked weight is an opaque oneDNN tensor: it cannot be sliced or viewed, and keeping
both layouts would hold the copy's weights twice. So each linear layer of the copy becomes
a `PackedLinear`: prefill runs the modules, the lean step holds the same `PackedWeight`s,
and a merge (`merged.py`) packs W0 + delta afresh into them. A decoder layer's q, k and v
projections, and its gate and up projections, take one input: they are blocked as one
weight each (`BlockedGroup`), which oneDNN multiplies faster than its parts (AVX2, 2
cores, 32 rows: q/k/v 215 us against 271 with the outputs concatenated, gate/up 598
against 659; 64 rows: 372/426, 1,044/1,105), and each member module takes its columns of
the one product. The LM head stays plain: it is the embedding table's tensor, which
lookups need row-major.

Or packed for MKL's packed GEMM instead (`packing="mkl"`): `cblas_sgemm_pack` through
`torch.ops.mkl._mkl_reorder_linear_weight`, multiplied by `_mkl_linear` (what torch's
inductor lowers a float32 linear to where MKL is present). On an Intel Xeon with AVX2
kernels (2 cores, torch 2.13) the default model's layers' GEMMs took 75 ms against
oneDNN's 102 on its blocked weights at 32 rows, 43 against 68 at 8, 131 against 149 at 64
(benchmarks/RESULTS.md, 2026-12-01); `lean_decode.packs` times both on the model's first
layers and picks. MKL's packed buffer must not be copied to another address (its layout
depends on the buffer's alignment), so a merge packs afresh and swaps the buffer inside
the `PackedWeight` the lean step holds.

Used where the lean step would multiply every row count through oneDNN anyway
(`lean_decode.packs`); on a GPU, in bfloat16, or where torch's BLAS takes the fewest rows,
the copy keeps plain weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

# The rows a weight is blocked for: a decode step's batch; any row count may use it.
_BLOCKED_FOR_ROWS = 32
Packing = Literal["onednn", "mkl"]
PACKINGS: tuple[Packing, ...] = ("onednn", "mkl")


class PackedWeight:
    """A linear layer's weight ([out, in], float32, CPU) held packed for one library
    (`packing`); `load` packs another weight of the same shape into this same object, which
    is what the lean step holds."""

    def __init__(self, weight: torch.Tensor, packing: Packing) -> None:
        if packing not in PACKINGS:
            raise ValueError(f"packing={packing!r}: give one of {', '.join(PACKINGS)}")
        self.packing = packing
        self.out_features, self.in_features = weight.shape
        # `_mkl_linear` reads only the sizes and dtype of its unpacked weight when the
        # rows it is told it was packed for are the input's (`mkl_linear` in torch's
        # aten/src/ATen/native/mkldnn/Linear.cpp): one element stands in for it.
        self._shape = weight.new_empty(1, 1).expand(self.out_features, self.in_features)
        self.tensor = self._pack(weight)

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        plain = weight.detach().contiguous()
        if self.packing == "mkl":
            mkl: torch.Tensor = torch.ops.mkl._mkl_reorder_linear_weight(plain, _BLOCKED_FOR_ROWS)
            return mkl
        blocked: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(plain, _BLOCKED_FOR_ROWS)
        return blocked

    def load(self, weight: torch.Tensor) -> None:
        """Hold `weight` (plain layout, this shape) from now on, packed afresh."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(
                f"weight of shape {tuple(weight.shape)} for a layer of "
                f"({self.out_features}, {self.in_features})"
            )
        self.tensor = self._pack(weight)

    def __deepcopy__(self, memo: dict[int, Any]) -> PackedWeight:
        # torch cannot copy oneDNN's opaque tensor ("Cannot access storage"), and a copied
        # MKL buffer at another address would multiply wrongly (its layout follows the
        # address's alignment); the plain weight is not kept to pack again.
        raise TypeError(
            f"a weight packed for {self.packing} cannot be copied; copy the plain model "
            "and pack the copy (packed.pack) instead"
        )

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`F.linear(x, weight, bias)` through the library this weight is packed for."""
        if self.packing == "mkl":
            # Told the input's own row count: MKL's packed B serves any number of rows.
            rows = x.numel() // x.shape[-1]
            out: torch.Tensor = torch.ops.mkl._mkl_linear(
                x.contiguous(), self.tensor, self._shape, bias, rows
            )
            return out
        return onednn_linear(x, self.tensor, bias)


def block(weight: torch.Tensor, packing: Packing = "onednn") -> PackedWeight:
    """`weight` ([out, in], float32, CPU) packed for `packing`'s library."""
    return PackedWeight(weight, packing)


class BlockedGroup:
    """Linear layers of one input (a layer's q, k and v; its gate and up) blocked as one
    weight; each member takes its columns of the product (`take`)."""

    def __init__(
        self,
        names: Sequence[str],
        linears: Sequence[torch.nn.Linear],
        packing: Packing = "onednn",
    ) -> None:
        self.names = list(names)  # the members' module names in the model
        self.widths = [linear.out_features for linear in linears]
        self.blocked = block(torch.cat([linear.weight.detach() for linear in linears]), packing)
        biases = [linear.bias for linear in linears]
        self.bias: torch.Tensor | None = None
        if any(bias is not None for bias in biases):
            self.bias = torch.cat(
                [
                    b.detach() if b is not None else linear.weight.new_zeros(linear.out_features)
                    for b, linear in zip(biases, linears, strict=True)
                ]
            )
        # The product for the input the members are taking it for: dropped once each
        # member has taken its columns, so no layer's activations outlive its forward.
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._taken: set[int] = set()

    def take(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Member `index`'s output for `x`: its columns of the group's product."""
        # The same tensor object (held here, so its memory is not another's): the members
        # of a transformers layer take one input, unchanged between their calls.
        if x is not self._input or index in self._taken:
            self._output = self.blocked.linear(x, self.bias)
            self._input, self._taken = x, set()
        assert self._output is not None
        start = sum(self.widths[:index])
        columns = self._output[..., start : start + self.widths[index]]
        self._taken.add(index)
        if len(self._taken) == len(self.widths):
            self._input = self._output = None
        return columns

    def load(self, weights: Sequence[torch.Tensor]) -> None:
        """Hold `weights` (the members', plain layout) from now on, packed into the
        `PackedWeight` the lean step holds."""
        for weight, width, name in zip(weights, self.widths, self.names, strict=True):
            if weight.shape[0] != width:
                raise ValueError(f"{name}: a weight of {weight.shape[0]} rows for {width}")
        self.blocked.load(torch.cat(list(weights)))


class PackedLinear(torch.nn.Module):
    """A frozen `nn.Linear` whose weight is held blocked for oneDNN (`block`): its own, or
    its columns of a `BlockedGroup`'s."""

    bias: torch.nn.Parameter | None

    def __init__(
        self,
        linear: torch.nn.Linear,
        group: BlockedGroup | None = None,
        index: int = 0,
        packing: Packing = "onednn",
    ) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.group = group
        self.index = index
        self.blocked = group.blocked if group is not None else block(linear.weight, packing)
        self.bias = linear.bias

    def load(self, weight: torch.Tensor) -> None:
        """Hold `weight` ([out, in], plain layout) from now on, packed into the
        `PackedWeight` the lean step holds. A group's member is loaded with its group
        (`BlockedGroup.load`)."""
        if self.group is not None:
            raise ValueError("a member of a blocked group: load the group's weights together")
        self.blocked.load(weight)

    def nbytes(self) -> int:
        return self.in_features * self.out_features * 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group is not None:
            return self.group.take(self.index, x)
        return self.blocked.linear(x, self.bias)


def onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear` through oneDNN, on a plain weight as it is or a blocked one (`block`):
    the op torch's inductor lowers CPU linears to, the one torch exposes for it."""
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [None], "")
    return out


def packed_linear(
    x: torch.Tensor, weight: torch.Tensor | PackedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The lean step's linear for a packed copy: a `PackedWeight`'s own library; oneDNN's on
    a plain weight."""
    if isinstance(weight, PackedWeight):
        return weight.linear(x, bias)
    return onednn_linear(x, weight, bias)


# Sibling projections that take one input, blocked together (`BlockedGroup`).
_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def pack(model: Any, packing: Packing = "onednn") -> int:
    """Replace every `nn.Linear` of `model` but its LM head by a `PackedLinear` (siblings of
    one input blocked as one `BlockedGroup`), packed for `packing`'s library; the number
    replaced. `model` must be float32, on a CPU, and take no gradient."""
    head = model.get_output_embeddings()
    linears = {
        name: module
        for name, module in model.named_modules()
        if type(module) is torch.nn.Linear and module is not head
    }
    for name, module in linears.items():
        weight = module.weight
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            raise ValueError(f"{name}: a {weight.dtype} weight on {weight.device}")
    replaced: dict[str, PackedLinear] = {}
    for parent, _ in model.named_modules():
        prefix = f"{parent}." if parent else ""
        for siblings in _GROUPS:
            names = [prefix + sibling for sibling in siblings]
            members = [linears.get(name) for name in names]
            if any(member is None for member in members):
                continue
            parts = [member for member in members if member is not None]
            if len({member.in_features for member in parts}) != 1:
                continue
            group = BlockedGroup(names, parts, packing)
            for index, (name, member) in enumerate(zip(names, parts, strict=True)):
                replaced[name] = PackedLinear(member, group, index)
    for name, module in linears.items():
        replaced.setdefault(name, PackedLinear(module, packing=packing))
    for name, packed in replaced.items():
        model.set_submodule(name, packed)
    return len(replaced)


def packed_bytes(model: Any) -> int:
    """The bytes `model`'s `PackedLinear` layers hold (their blocked weights)."""
    return sum(m.nbytes() for m in model.modules() if isinstance(m, PackedLinear))


__all__ = [
    "PACKINGS",
    "BlockedGroup",
    "PackedLinear",
    "PackedWeight",
    "Packing",
    "block",
    "onednn_linear",
    "pack",
    "packed_bytes",
    "packed_linear",
]
