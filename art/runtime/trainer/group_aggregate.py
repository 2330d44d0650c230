"""`group_aggregate`: a statistic of token values per group label, within each sequence."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ...core.data.errors import ConfigError

if TYPE_CHECKING:
    import torch

Reduction = Literal["sum", "mean", "var", "std", "count", "min", "max"]
_REDUCTIONS = ("sum", "mean", "var", "std", "count", "min", "max")


def group_aggregate(
    values: torch.Tensor,
    *,
    by: torch.Tensor,
    reduce: Reduction = "mean",
    eps: float = 1e-8,
    broadcast: bool = True,
) -> torch.Tensor:
    """Reduce `values` ([B, S, *F]) over the tokens of each sequence that share a label
    in `by` ([B, S]; any labels, numbered together over the whole batch).

    With `broadcast` each token gets its group's statistic (the shape of `values`);
    without it the result is [B, K, *F] for the K labels in ascending order, a label
    absent from a sequence giving the reduction's empty value (0, or ±inf for min/max).
    `mean` divides by count + `eps`; `var` is E[x²] - E[x]² (clamped at 0) and `std`
    is sqrt(var + `eps`). Differentiable with respect to `values`.
    """
    import torch

    if reduce not in _REDUCTIONS:
        raise ConfigError("reduce", f"unknown reduction {reduce!r}", f"Use one of {_REDUCTIONS}")
    if values.dim() < 2:
        raise ConfigError("values", "must have at least 2 dimensions [B, S]", "Add a batch axis")
    if tuple(by.shape[:2]) != tuple(values.shape[:2]):
        raise ConfigError(
            "by",
            f"shape {tuple(by.shape)} does not start with values' [B, S] {tuple(values.shape[:2])}",
            "Give one label per token",
        )
    batch, seq, *features = values.shape
    if values.numel() == 0:
        if broadcast:
            return values.clone()
        return values.new_empty((batch, 0, *features))
    labels = by.reshape(batch, seq)
    _, ids = torch.unique(labels, sorted=True, return_inverse=True)
    groups = int(ids.max().item()) + 1
    flat = values.reshape(batch, seq, -1)
    index = ids.unsqueeze(-1).expand_as(flat)

    def scatter_sum(source: torch.Tensor) -> torch.Tensor:
        out = flat.new_zeros((batch, groups, flat.shape[-1]))
        return out.scatter_add(1, index, source)

    if reduce in ("min", "max"):
        start = flat.new_full(
            (batch, groups, flat.shape[-1]), float("inf" if reduce == "min" else "-inf")
        )
        agg = start.scatter_reduce(1, index, flat, reduce="amin" if reduce == "min" else "amax")
    else:
        count = scatter_sum(torch.ones_like(flat))
        if reduce == "count":
            agg = count
        elif reduce == "sum":
            agg = scatter_sum(flat)
        else:
            mean = scatter_sum(flat) / (count + eps)
            if reduce == "mean":
                agg = mean
            else:
                var = (scatter_sum(flat * flat) / (count + eps) - mean * mean).clamp(min=0.0)
                agg = var if reduce == "var" else torch.sqrt(var + eps)
    if broadcast:
        return agg.gather(1, index).reshape(values.shape)
    return agg.reshape(batch, groups, *features)


__all__ = ["Reduction", "group_aggregate"]
