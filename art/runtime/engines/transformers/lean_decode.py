"""One decode step of a Llama-family model as plain tensor ops over its weights.

On a CPU a decode step of a small model spends more time in transformers' module stack
than in arithmetic: measured on the default model (30 layers, width 576, bf16, 32 rows),
a step through `model(...)` took 70 ms of which the matmuls were 25 ms; the rest is
~45 tensor ops and a dozen module calls per layer, each costing microseconds of Python
and dispatch. Here a step is the same computation in ~25 ops a layer, with each layer's
query/key/value projections as one matmul and its gate/up projections as one: the plain
copy's weights are re-pointed at views of one fused buffer per layer, so the
transformers model (which still runs prefill) and this step share every weight, and a
merge into the copy (`merged.py`) updates both.

In float32 the step's matmuls go to oneDNN rather than torch's BLAS where torch has it
(`models.cpu_kernels().decode_gemm`): on an AMD EPYC oneDNN streamed the weights about twice
as fast at a decode step's few rows (the LM head most of all, at every batch size measured).
Not on every CPU: on an Intel Xeon (AMX, AVX512-BF16) torch's BLAS (MKL) was 1.4-1.7x faster
at 1 and 2 rows and oneDNN 1.1-1.2x faster from 8 to 32. So unless `ART_DECODE_GEMM` names
one, the decoder times both on its own weights at start-up and gives the fewest rows to BLAS
where BLAS is clearly faster there (`_RowSplitLinear`). Where every row count goes to oneDNN
(`packs`), the engine's copy holds its layers' weights packed ahead (`packed.py`): blocked
for oneDNN, or packed for MKL's packed GEMM where that times clearly faster on the model's
first layers (on an Intel Xeon with AVX2 kernels it took 0.67-0.76x oneDNN's time at 8 and
32 rows; with its AVX512 kernels 0.85-0.90x, near the margin); MKL's packed GEMM then takes
every row count. The step multiplies q, k and v (and gate and up) one packed weight at a
time, since a packed weight cannot be a view of a fused buffer. The LM head is blocked too,
but only while decoding: it is the embedding table, which lookups and the trainer need
plain, so its blocked form is a second copy (113 MB for the default model), dropped at every
pause of the engine (`release`), where training wants the memory and the weights may change.
Blocking it takes ~40 ms and saves ~2-3 ms a step of 8 to 64 rows (AMD EPYC, AVX2), so it is
made once the steps since the pause have paid for it (`_HEAD_BLOCKED_AFTER`): a short or
one-row run never pays it.

On a GPU the same step's arithmetic (`forward`) runs over static buffers and is replayed
from CUDA graphs (`decode_graphs.py`): there a step is bound by kernel launches, not ops.

Only the sampling copy (a plain model, no adapter wrappers, no grad) runs this, and only
for the architectures whose decoder layer it reproduces exactly (`SUPPORTED`); anything
else decodes through transformers. The tests hold it to transformers' own forward pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from ... import models
from ...decode_attention import grouped_attention
from .kv_cache import GrowingLayer
from .packed import PackedLinear, PackedWeight, Packing, block, packed_linear
from .packed import onednn_linear as _onednn_linear

# model_type -> whether its q/k/v projections carry a bias (Qwen2's do, Llama's do not).
SUPPORTED = {"llama": False, "qwen2": True}
# Row counts at which BLAS may take a decode step's matmuls from oneDNN, and by how much it
# must be faster there: a margin well over the timing's noise, so a busy machine does not
# flip the choice (measured 1.4-1.7x where BLAS wins, at 1 and 2 rows; 1.1x at 4, left to
# oneDNN: near the margin a choice could differ between two starts).
_BLAS_ROW_CANDIDATES = (1, 2)
_BLAS_MARGIN = 1.25
# MKL's packed GEMM must be this much faster than oneDNN's blocked weights, timed at 8
# and 32 rows on the model's first `_PACKING_TIMED_LAYERS` layers, to be picked. Enough
# layers that their weights stream from memory as a whole step's do (two layers sat in
# cache, where MKL's lead was smaller and noisier: 1.18-1.62x between starts against
# 1.37x over whole steps), the two libraries' passes interleaved, so a busy spell weighs
# on both. On an Intel Xeon (2 cores) MKL's lead over six layers read 1.39-1.55x with AVX2
# kernels and 1.07-1.18x with AVX512 ones (where a closed loop ran ~6% faster with MKL:
# either choice is near-equal there, so a flip costs little).
_MKL_MARGIN = 1.1
_PACKING_TIMED_LAYERS = 6
_PACKING_TIMED_PASSES = 5
_PACKING_TIMED_ROWS = (8, 32)
# Decode steps of at least `_HEAD_WIDE_ROWS` rows after which a packed copy's LM head is
# blocked: by then those steps would have saved what blocking costs (~40 ms against ~2-3
# ms a step), so a run that stops right after pays at most twice what it had to.
_HEAD_BLOCKED_AFTER = 16
_HEAD_WIDE_ROWS = 8
KeysValues = tuple[torch.Tensor, torch.Tensor]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Attention = Literal["fused", "matmul"]


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor
    # [(heads + 2 kv heads) x head_dim, hidden]: q, k, v rows stacked (in a packed copy,
    # `packed.py`, blocked as one weight: its q/k/v group's).
    qkv: torch.Tensor | PackedWeight
    qkv_bias: torch.Tensor | None
    o: torch.Tensor | PackedWeight
    post_norm: torch.Tensor
    gate_up: torch.Tensor | PackedWeight  # [2 x intermediate, hidden]: gate rows, then up rows
    down: torch.Tensor | PackedWeight


class LeanDecoder:
    """Decode steps for `model` (a plain causal LM of a `SUPPORTED` type, no grad).

    `attention`: "fused" (torch's fused kernel, a CPU's default) or "matmul" (two matmuls
    and a softmax, a GPU's default: what its CUDA graphs were measured with).
    """

    def __init__(self, model: Any, attention: Attention | None = None) -> None:
        if attention not in (None, "fused", "matmul"):
            raise ValueError(f"attention={attention!r}: give 'fused', 'matmul' or None")
        config = model.config
        self.model = model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        decoder = model.get_decoder()
        self.embed = decoder.embed_tokens
        self.rotary = decoder.rotary_emb
        self.norm = decoder.norm.weight
        self.head = model.get_output_embeddings()
        self._blocked_head: PackedWeight | None = None  # a packed copy's, between pauses
        self._wide_steps = 0  # steps of `_HEAD_WIDE_ROWS` rows or more since `release`
        self.layers = [self._fuse(layer) for layer in decoder.layers]
        first = self.layers[0]
        self.linear: Callable[..., torch.Tensor] = F.linear  # on a GPU: cuBLAS
        on_cpu = self.norm.device.type == "cpu"
        self.attention: Attention = attention or ("fused" if on_cpu else "matmul")
        self._attend: Attend = grouped_attention if self.attention == "fused" else _matmul_attention
        o_proj = decoder.layers[0].self_attn.o_proj
        self.packed = isinstance(o_proj, PackedLinear)
        # The library a packed copy's weights are packed for; its LM head is packed alike.
        self.packing: Packing | None = o_proj.blocked.packing if self.packed else None
        if self.packed:
            self.linear = packed_linear
        elif on_cpu:  # unpacked: every weight is a plain tensor
            weights = [first.qkv, first.o, first.gate_up, first.down, self.head.weight]
            plain = [weight for weight in weights if isinstance(weight, torch.Tensor)]
            self.linear = linear_for(self.norm.dtype, plain)

    def release(self) -> None:
        """Drop the blocked LM head (a packed copy's); the next step blocks it again."""
        self._blocked_head = None
        self._wide_steps = 0

    @property
    def held_bytes(self) -> int:
        """Bytes held beyond the model's own weights: the blocked LM head, when held."""
        return self.head.weight.nbytes if self._blocked_head is not None else 0

    def _head_weight(self) -> torch.Tensor | PackedWeight:
        if self._blocked_head is not None:
            return self._blocked_head
        return self.head.weight  # type: ignore[no-any-return]

    def _count_step(self, rows: int) -> None:
        """Block a packed copy's LM head once enough wide steps have run since `release`."""
        if self.packing is not None and self._blocked_head is None and rows >= _HEAD_WIDE_ROWS:
            self._wide_steps += 1
            if self._wide_steps >= _HEAD_BLOCKED_AFTER:
                self._blocked_head = block(self.head.weight, self.packing)

    @classmethod
    def of(cls, model: Any, attention: Attention | None = None) -> LeanDecoder | None:
        """A decoder for `model`, or None where its architecture is not one this reproduces."""
        return cls(model, attention) if _reproduces(model) else None

    @staticmethod
    def _fuse(layer: Any) -> _Layer:
        attention, mlp = layer.self_attn, layer.mlp
        if isinstance(attention.q_proj, PackedLinear):  # q/k/v and gate/up blocked as one
            qkv_group, gate_up_group = attention.q_proj.group, mlp.gate_proj.group
            assert qkv_group is not None  # `packed.pack` groups them
            assert gate_up_group is not None
            return _Layer(
                input_norm=layer.input_layernorm.weight,
                qkv=qkv_group.blocked,
                qkv_bias=qkv_group.bias,
                o=attention.o_proj.blocked,
                post_norm=layer.post_attention_layernorm.weight,
                gate_up=gate_up_group.blocked,
                down=mlp.down_proj.blocked,
            )
        qkv = _fused([attention.q_proj, attention.k_proj, attention.v_proj])
        bias = None
        if attention.q_proj.bias is not None:
            bias = _fused([attention.q_proj, attention.k_proj, attention.v_proj], name="bias")
        return _Layer(
            input_norm=layer.input_layernorm.weight,
            qkv=qkv,
            qkv_bias=bias,
            o=attention.o_proj.weight,
            post_norm=layer.post_attention_layernorm.weight,
            gate_up=_fused([mlp.gate_proj, mlp.up_proj]),
            down=mlp.down_proj.weight,
        )

    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        attention: torch.Tensor,
        cache: Any,
    ) -> torch.Tensor:
        """Float32 next-token logits [rows, vocab] after `tokens` [rows] at `positions`
        [rows, 1]; `attention` [rows, cached + 1] masks left padding; `cache` grows by one."""
        rows = tokens.shape[0]
        self._count_step(rows)
        mask = torch.zeros(attention.shape, dtype=torch.float32, device=attention.device)
        mask.masked_fill_(attention == 0, float("-inf"))

        def store(index: int, key: torch.Tensor, value: torch.Tensor) -> KeysValues:
            cache_layer = cache.layers[index]
            assert isinstance(cache_layer, GrowingLayer)
            return cache_layer.update(key, value)

        return self.forward(tokens, positions, mask.view(rows, 1, -1, 1), store)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        store: Callable[[int, torch.Tensor, torch.Tensor], KeysValues],
    ) -> torch.Tensor:
        """The step's arithmetic: `mask` [rows, 1, positions, 1] is added to the attention
        scores; `store(layer, key, value)` keeps the new key and value ([rows, kv heads, 1,
        head dim]) and gives back the keys and values to attend over ([rows, kv heads,
        positions, head dim]). No host synchronisation, so a CUDA graph can capture it."""
        rows = tokens.shape[0]
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        hidden = self.embed(tokens)  # [rows, width]
        if self.attention == "fused":  # its mask: [rows, 1, 1, positions], the dtype's
            mask = mask.view(rows, 1, 1, -1).to(hidden.dtype)
        cos, sin = self.rotary(hidden, positions)  # [rows, 1, head_dim]
        q_width = heads * head_dim
        for index, layer in enumerate(self.layers):
            normed = _rms_norm(hidden, layer.input_norm, self.eps)
            qkv = self.linear(normed, layer.qkv, layer.qkv_bias)
            # Queries and keys rotate together: one set of rotary ops for both.
            qk = qkv[:, : q_width + kv_heads * head_dim].view(rows, heads + kv_heads, head_dim)
            qk = qk * cos + _rotate_half(qk) * sin
            query = qk[:, :heads].reshape(rows, kv_heads, heads // kv_heads, head_dim)
            key = qk[:, heads:].unsqueeze(2)  # [rows, kv heads, 1, head_dim]
            value = qkv[:, q_width + kv_heads * head_dim :].view(rows, kv_heads, 1, head_dim)
            keys, values = store(index, key, value)
            attended = self._attend(query, keys, values, mask).reshape(rows, q_width)
            hidden = hidden + self.linear(attended, layer.o)
            normed = _rms_norm(hidden, layer.post_norm, self.eps)
            gate, up = self.linear(normed, layer.gate_up).chunk(2, dim=-1)
            hidden = hidden + self.linear(F.silu(gate) * up, layer.down)
        return self.logits(_rms_norm(hidden, self.norm, self.eps))

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Float32 logits [rows, vocab] of final hidden states [rows, width] (after the
        decoder's last norm), through the step's own linear: on a CPU, oneDNN's, where
        torch's BLAS took the 49,152-wide head of the default model at 3 rows in 21 ms
        against oneDNN's ~5 (float32, 2 cores)."""
        return self.linear(normed.contiguous(), self._head_weight(), self.head.bias).float()


def _reproduces(model: Any) -> bool:
    """Whether the lean step reproduces `model`'s decoder layers on its device."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED or model.device.type not in ("cpu", "cuda"):
        return False
    unsupported = (
        getattr(config, "hidden_act", "silu") != "silu"
        or getattr(config, "mlp_bias", False)
        or getattr(config, "pretraining_tp", 1) != 1
        or getattr(config, "use_sliding_window", False)
        or (getattr(config, "attention_bias", False) and not SUPPORTED[model_type])
    )
    return not unsupported


def _matmul_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """One query per row ([rows, kv heads, group, head dim]) over `keys`/`values` ([rows,
    kv heads, positions, head dim]), `mask` [rows, 1, positions, 1] added to the scores:
    two matmuls and a float32 softmax."""
    # Keys times queries, not queries times transposed keys: the cached keys are a strided
    # view, and a CPU bmm copies a transposed one (~1 ms a layer at 32 rows).
    scale = query.shape[-1] ** -0.5
    scores = torch.matmul(keys, query.transpose(-1, -2)).float().mul_(scale)
    weights = torch.softmax(scores.add_(mask), dim=-2).to(values.dtype)
    return torch.matmul(weights.transpose(-1, -2), values)


def packs(model: Any) -> Packing | None:
    """How the sampling copy `model` should hold its linear layers packed ahead
    (`packed.py`), or None: a float32 model on a CPU of an architecture the lean step
    reproduces. Packed for MKL's packed GEMM where `ART_DECODE_GEMM=mkl` names it, or,
    unless a library is named, where it times clearly faster than oneDNN on the model's
    first layers; else blocked for oneDNN where the lean step would multiply every row
    count through oneDNN (not where torch's BLAS takes the fewest rows)."""
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return None
    if not _reproduces(model) or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return None
    layer = model.get_decoder().layers[0]
    attention, mlp = layer.self_attn, layer.mlp
    projections = [attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj]
    projections += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    if not all(type(p) is torch.nn.Linear for p in projections):
        return None
    kernels = models.cpu_kernels()
    if kernels.decode_gemm == "mkl":
        return "mkl"
    if kernels.decode_gemm != "onednn":
        return None
    # Timed first: MKL's packed GEMM serves every row count, the fewest included (where
    # torch's BLAS, MKL unpacked, may beat oneDNN), so where it wins no split is needed.
    unnamed = not kernels.decode_gemm_named
    if unnamed and models.mkl_packed_linear_available() and _faster_packing(model) == "mkl":
        return "mkl"
    weights = [p.weight for p in projections] + [model.get_output_embeddings().weight]
    if linear_for(torch.float32, weights) is not _onednn_linear:
        return None
    return "onednn"


# The timed choice by the timed weights' shapes and this process's kernels: one timing
# a process (engine restarts and a benchmark's floor then agree with the engine's copy).
_faster_packings: dict[tuple[Any, ...], Packing] = {}


def _faster_packing(model: Any) -> Packing:
    """MKL's packing where its packed GEMM multiplies the first layers' weights (as
    `packed.pack` groups them) `_MKL_MARGIN` times as fast as oneDNN's blocked weights,
    else oneDNN's. Each its best of `_PACKING_TIMED_PASSES` passes at each row count, the
    two libraries' passes taken in turn; ~0.5 s for the default model, once a process."""
    layers = model.get_decoder().layers[:_PACKING_TIMED_LAYERS]
    # Keyed before the weights are concatenated: a cached answer copies nothing.
    shapes = tuple(tuple(p.shape) for layer in layers for p in layer.parameters())
    key = (shapes, torch.backends.cpu.get_cpu_capability())
    if key in _faster_packings:
        return _faster_packings[key]
    weights: list[torch.Tensor] = []
    for layer in layers:
        attention, mlp = layer.self_attn, layer.mlp
        qkv = [attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight]
        weights.append(torch.cat(qkv))
        weights += [attention.o_proj.weight, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])]
        weights.append(mlp.down_proj.weight)
    packings: tuple[Packing, Packing] = ("onednn", "mkl")
    packed = {packing: [block(weight, packing) for weight in weights] for packing in packings}
    best = dict.fromkeys(packings, 0.0)
    with torch.no_grad():
        for rows in _PACKING_TIMED_ROWS:
            inputs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
            fastest = dict.fromkeys(packings, float("inf"))
            for attempt in range(_PACKING_TIMED_PASSES + 1):  # the first warms, untimed
                for packing in packings:
                    started = time.perf_counter()
                    for weight in packed[packing]:
                        weight.linear(inputs[weight.in_features])
                    if attempt:
                        fastest[packing] = min(fastest[packing], time.perf_counter() - started)
            for packing in packings:
                best[packing] += fastest[packing]
    del packed
    mkl, onednn = best["mkl"], best["onednn"]
    chosen: Packing = "mkl" if mkl * _MKL_MARGIN < onednn else "onednn"
    models.say_once(
        f"art: float32 decode steps: MKL's packed GEMM {mkl * 1e3:.1f} ms, oneDNN "
        f"{onednn * 1e3:.1f} ms on {len(layers)} layers at 8 and 32 rows: "
        + ("the sampling copy packed for MKL" if chosen == "mkl" else "oneDNN kept")
    )
    _faster_packings[key] = chosen
    return chosen


def linear_for(
    dtype: torch.dtype, weights: Sequence[torch.Tensor] = ()
) -> Callable[..., torch.Tensor]:
    """The linear a decode step of weights in `dtype` multiplies with: in bfloat16
    `_bf16_linear`; in float32 oneDNN's where `models.cpu_kernels()` picks it, else
    `F.linear`. Where oneDNN was picked without `ART_DECODE_GEMM` naming it and `weights`
    (a step's) are given, the rows at which BLAS is clearly faster on them go to BLAS
    (`_RowSplitLinear`)."""
    if dtype == torch.bfloat16:
        return _bf16_linear
    kernels = models.cpu_kernels()
    if dtype != torch.float32 or kernels.decode_gemm != "onednn":
        return F.linear
    if not weights or kernels.decode_gemm_named:
        return _onednn_linear
    blas_rows = _rows_blas_wins(weights)
    if not blas_rows:
        return _onednn_linear
    models.say_once(
        f"art: float32 decode steps: torch's BLAS at up to {blas_rows} rows, oneDNN above"
    )
    return _RowSplitLinear(blas_rows)


def gemm_name(linear: Callable[..., torch.Tensor]) -> str:
    """What a linear `linear_for` gave multiplies with, in words."""
    if linear is F.linear:
        return "blas"
    if linear is _bf16_linear:
        return "blas (a matrix-vector product at 1 row)"
    if isinstance(linear, _RowSplitLinear):
        return f"blas at <= {linear.blas_rows} rows, onednn above"
    return "onednn"


class _RowSplitLinear:
    """`F.linear` (torch's BLAS) for inputs of at most `blas_rows` rows, oneDNN's above."""

    def __init__(self, blas_rows: int) -> None:
        self.blas_rows = blas_rows

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if x.shape[0] <= self.blas_rows:
            return F.linear(x, weight, bias)
        return _onednn_linear(x, weight, bias)


def _bf16_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear` in bfloat16, one bias-free row through `torch.mv`: the same bits, and on
    an Intel Xeon with AVX512-BF16 1.5-2.7x faster (torch 2.13 sends a 1-row bf16 matmul
    to oneDNN, a matrix-vector product to its own kernel; with oneDNN limited to AVX2 on
    that Xeon the two timed alike). One row is every single-request decode: a judge's
    answer, a lone rollout."""
    # With a bias, `addmv` rounded differently from `F.linear` under oneDNN limited to AVX2.
    if x.shape[0] != 1 or bias is not None:
        return F.linear(x, weight, bias)
    return torch.mv(weight, x[0]).unsqueeze(0)


# The BLAS split by the timed weights' shapes and dtypes and this process's kernels: one
# timing a process, as `_faster_packings` (two timings in one process once disagreed near
# the margin, so a second copy of the same model was packed where the first was not).
_blas_rows: dict[tuple[Any, ...], int] = {}


def _rows_blas_wins(weights: Sequence[torch.Tensor]) -> int:
    """The most rows up to which torch's BLAS multiplies `weights` at least `_BLAS_MARGIN`
    times as fast as oneDNN at every candidate row count (0: at none). Each library's best
    of three passes over the weights; ~0.2 s for the default model, once a process."""
    key = (
        tuple((tuple(w.shape), w.dtype) for w in weights),
        torch.backends.cpu.get_cpu_capability(),
    )
    if key in _blas_rows:
        return _blas_rows[key]

    def best_seconds(linear: Callable[..., torch.Tensor], rows: int) -> float:
        inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights}
        best = float("inf")
        with torch.no_grad():
            for attempt in range(4):  # the first warms the kernels and caches, untimed
                started = time.perf_counter()
                for weight in weights:
                    linear(inputs[weight.shape[1]], weight)
                if attempt:
                    best = min(best, time.perf_counter() - started)
        return best

    chosen = 0
    for rows in _BLAS_ROW_CANDIDATES:
        if best_seconds(_onednn_linear, rows) < _BLAS_MARGIN * best_seconds(F.linear, rows):
            break
        chosen = rows
    _blas_rows[key] = chosen
    return chosen


def _fused(linears: list[torch.nn.Linear], name: str = "weight") -> torch.Tensor:
    """One buffer holding the linears' `name` tensors stacked on dim 0, each re-pointed at
    its slice: the modules keep working, and every write to one lands in the buffer."""
    parts = [getattr(linear, name) for linear in linears]
    fused = torch.cat([part.detach() for part in parts])
    offset = 0
    for part in parts:
        size = part.shape[0]
        part.data = fused[offset : offset + size]
        offset += size
    return fused


def _rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama RMSNorm, op for op: normalised in float32, scaled in the dtype."""
    as_float = hidden.float()
    variance = as_float.pow(2).mean(-1, keepdim=True)
    return weight * (as_float * torch.rsqrt(variance + eps)).to(hidden.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


__all__ = ["SUPPORTED", "LeanDecoder", "gemm_name", "linear_for", "packs"]
