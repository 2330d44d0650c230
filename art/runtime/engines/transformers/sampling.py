"""Next-token sampling for the decode loop: one pass over the vocabulary per row.

`torch.multinomial` draws one exponential variate per vocabulary entry (49k for the
default model) with a sequential generator: on a CPU that was the largest single cost
of a decode step, more than the model's matmuls. Here each row needs one uniform
variate: the distribution is summed in blocks, the block holding the variate is found
on the blocks' cumulative sums, then the token inside that block. Exact up to the
rounding of each block's float32 sum (relatively < 256 x 2^-24; the sums are then
accumulated in float64), and a zero-probability token is never drawn.

The logprobs returned for training are those of the model's own temperature-1
distribution (`logsumexp` per row, no full `log_softmax`), whatever the row sampled
from (temperature, top_p, a grammar's mask). Where every row sampled from exactly that
distribution (temperature 1, no top_p, no mask: RL rollouts), the draw's own sums give
the normalizers (`sample_with_normalizers`), not a second pass over the vocabulary.

The weights are written into a buffer whose width is the vocabulary rounded up to whole
blocks (its tail zeros, never drawn), kept between a batch's steps (`WeightsBuffer`): on a
CPU a fresh [rows, vocab] float32 tensor of 32 MiB or more (256 rows of the default model,
64 of a 151,936-token vocabulary) is a mapping of its own, faulted in afresh every step
(glibc's mmap threshold tops out at 32 MiB): 17.5-18.7 ms against 4.0 for `logits - peak`,
its `exp_` and a sum at 256 rows x 49,152 (2 cores, AVX512). Padding a vocabulary that is
not a whole number of blocks (Qwen2's 151,936) was another such copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_BLOCK = 256  # vocabulary entries summed together before the search


class WeightsBuffer:
    """Where a draw writes its unnormalised probabilities, kept from step to step: [rows,
    vocab rounded up to `_BLOCK`], grown to the most rows asked for, its tail columns zero."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None

    def rows_for(self, logits: torch.Tensor) -> torch.Tensor:
        """The first `logits.shape[0]` rows of the buffer, fitted to `logits` (vocabulary,
        dtype, device); their first `vocab` columns are to be written, the rest are zero."""
        rows, vocab = logits.shape
        width = vocab + (-vocab % _BLOCK)
        buffer = self._buffer
        if (
            buffer is None
            or buffer.shape[0] < rows
            or buffer.shape[1] != width
            or buffer.dtype != logits.dtype
            or buffer.device != logits.device
        ):
            buffer = torch.zeros((rows, width), dtype=logits.dtype, device=logits.device)
            self._buffer = buffer
        return buffer[:rows]

    @property
    def nbytes(self) -> int:
        return self._buffer.nbytes if self._buffer is not None else 0

    def release(self) -> None:
        """Let the buffer go (a batch ended); the next draw makes a new one."""
        self._buffer = None


def normalizers(logits: torch.Tensor) -> torch.Tensor:
    """log of each row's partition function: logprob = logit - normalizer ([rows])."""
    return torch.logsumexp(logits, dim=-1)


def sample(
    logits: torch.Tensor,
    temperatures: Sequence[float],
    top_ps: Sequence[float],
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """One token per row of `logits` ([rows, vocab], float32; -inf where masked).

    A row with temperature 0 takes its argmax; a seeded row (a generator) draws its
    variate from that generator, so the same seed and logits give the same token.
    """
    return _draw(logits, temperatures, top_ps, generators)[0]


def sample_with_normalizers(
    logits: torch.Tensor,
    temperatures: Sequence[float],
    top_ps: Sequence[float],
    generators: Sequence[torch.Generator | None],
    unmasked: torch.Tensor | None = None,
    buffer: WeightsBuffer | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample`'s tokens and `normalizers(unmasked)`, where `unmasked` is the logits before
    a grammar's mask made `logits` (None: nothing was masked). Where every row drew from
    the temperature-1 distribution of unmasked logits, the draw's sums are the normalizers.
    `buffer`: where the draw's weights go (a decode loop's, kept between its steps)."""
    tokens, peak, total = _draw(logits, temperatures, top_ps, generators, buffer)
    if unmasked is None and total is not None:
        return tokens, (peak.squeeze(1).double() + total.log()).to(logits.dtype)
    return tokens, normalizers(logits if unmasked is None else unmasked)


def _draw(
    logits: torch.Tensor,
    temperatures: Sequence[float],
    top_ps: Sequence[float],
    generators: Sequence[torch.Generator | None],
    buffer: WeightsBuffer | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The tokens, each row's largest logit ([rows, 1]) and, where every row's weights are
    exp(logit - largest) (temperature 1, no top_p), their float64 sums ([rows])."""
    rows, vocab = logits.shape
    device = logits.device
    # The per-row settings travel to the device without waiting for it (non_blocking), and
    # which rows are greedy or nucleus-sampled is read from the host's lists: on a GPU
    # the step never waits on the device here.
    natural = all(t == 1 and p >= 1 for t, p in zip(temperatures, top_ps, strict=True))
    # Unnormalised probabilities at each row's temperature: exp((l - max) / t).
    # amax, not max: max also finds the indices, 12x the time on a CPU ([32, 49,152]
    # float32: 498 us against 40, AVX2, 2 cores).
    peak = logits.amax(dim=-1, keepdim=True)
    kept = buffer if buffer is not None else WeightsBuffer()
    blocked = kept.rows_for(logits)  # [rows, whole blocks]
    weights = torch.sub(logits, peak, out=blocked[:, :vocab])
    if not natural:
        temperature = _to(device, torch.tensor(temperatures, dtype=logits.dtype))
        weights.div_(temperature.clamp(min=1e-5)[:, None])
    weights.exp_()
    nucleus = [i for i, (t, p) in enumerate(zip(temperatures, top_ps, strict=True)) if p < 1 and t]
    if nucleus:
        index = _to(device, torch.tensor(nucleus))
        top_p = _to(device, torch.tensor([top_ps[i] for i in nucleus], dtype=logits.dtype))
        weights[index] = _nucleus(weights[index], top_p)
    seeded = [i for i, generator in enumerate(generators) if generator is not None]
    if device.type == "cpu":
        uniforms = torch.empty(rows, dtype=torch.float64)
        unseeded = [i for i, generator in enumerate(generators) if generator is None]
        if unseeded:
            uniforms[unseeded] = torch.rand(len(unseeded), dtype=torch.float64)
    else:
        uniforms = torch.rand(rows, dtype=torch.float64, device=device)
    if seeded:  # drawn on the host from each row's own generator: the same seed, the same draw
        drawn = torch.cat(
            [torch.rand(1, dtype=torch.float64, generator=generators[i]) for i in seeded]
        )
        uniforms[_to(device, torch.tensor(seeded))] = _to(device, drawn)
    tokens, totals = _inverse_cdf(blocked, vocab, uniforms)
    greedy = [i for i, t in enumerate(temperatures) if t == 0]
    if greedy:
        index = _to(device, torch.tensor(greedy))
        tokens[index] = logits[index].argmax(dim=-1)
    return tokens, peak, totals if natural else None


def _to(device: torch.device, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` (on the host) on `device`, copied without waiting for the device."""
    return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)


def _nucleus(weights: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Nucleus sampling (Holtzman et al., 2019): keep the smallest set of tokens whose
    probability reaches top_p, always at least the most likely one."""
    probs = weights / weights.sum(dim=-1, keepdim=True)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs.masked_fill_(before >= top_p[:, None], 0)  # a boolean index would sync
    return torch.zeros_like(probs).scatter_(1, order, sorted_probs)


def _inverse_cdf(
    weights: torch.Tensor, vocab: int, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token of each row whose cumulative weight first exceeds uniform x total, and
    each row's total (float64); `weights` [rows, whole blocks] are zero past `vocab`."""
    rows = weights.shape[0]
    blocks = weights.view(rows, -1, _BLOCK)
    # Summed in the weights' dtype, then accumulated in float64: a float64 sum converts
    # the whole [rows, vocab] first, which cost more than the rest of the search.
    block_cdf = blocks.sum(dim=-1).double().cumsum(dim=-1)
    target = uniforms * block_cdf[:, -1]
    # right=True: the first block whose cumulative weight is > target, so an empty
    # (all-zero) block is never chosen; clamped for the rounding case target == total.
    block = torch.searchsorted(block_cdf, target[:, None], right=True).clamp_(
        max=blocks.shape[1] - 1
    )
    before = torch.where(
        block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), block_cdf.new_zeros(())
    )
    inside = blocks[torch.arange(rows, device=weights.device), block.squeeze(1)]
    inside_cdf = inside.to(torch.float64).cumsum(dim=-1)
    offset = torch.searchsorted(inside_cdf, target[:, None] - before, right=True)
    # Rounding can leave the target just past the block's own sum: take its last
    # nonzero entry then, never a zero-weight one.
    last_nonzero = _BLOCK - 1 - (inside.flip(-1) > 0).to(torch.int64).argmax(dim=-1, keepdim=True)
    offset = torch.minimum(offset, last_nonzero)
    return (block * _BLOCK + offset).squeeze(1).clamp_(max=vocab - 1), block_cdf[:, -1]


__all__ = ["WeightsBuffer", "normalizers", "sample", "sample_with_normalizers"]
