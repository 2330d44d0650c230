"""Micro-batches by token budget: sequences packed end to end, no padding computed.

`pack` groups sequences (first-fit, longest first) into micro-batches of at most
`capacity` tokens; a sequence longer than that trains alone. `MicroBatch.of` lays a
micro-batch out as one row: the sequences concatenated, `position_ids` restarting at 0
at each one. transformers reads restarting positions as packed sequences and masks
attention across their boundaries, so no sequence sees another and no pad token is
computed on. With `share_prefixes` the row is a prefix tree instead (`shared_prefix.py`):
a prefix that several sequences share appears once, with a 4D attention mask that lets
each token see its own sequences only. Only the hidden states that predict trained
tokens go through the LM head; a trained token of a shared prefix is predicted once per
sequence that trains it, since each sequence's loss term is its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .shared_prefix import PrefixTree
from .tokenize import TrainingSequence

# A row of several packed sequences attends through a block mask, which SDPA's CPU
# kernel computes in full (no causal skipping, unlike a lone sequence's `is_causal`
# path); rows of several sequences are therefore kept this short, long sequences alone.
PACKED_ROW_TOKENS = 1024


def pack(
    lengths: Sequence[int], capacity: int, max_sequences: int | None = None
) -> list[list[int]]:
    """Indices of `lengths` grouped into bins of at most `capacity` tokens each.

    First-fit decreasing; a length over `capacity` gets a bin of its own, and no bin
    holds more than `max_sequences` entries when that is set.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, left in enumerate(room):
            if lengths[i] <= left and (max_sequences is None or len(bins[b]) < max_sequences):
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


@dataclass(frozen=True)
class MicroBatch:
    """A micro-batch packed in one row, and its trained tokens laid out per sequence."""

    input_ids: torch.Tensor  # [1, tokens]
    position_ids: torch.Tensor  # [1, tokens], 0 at the start of each sequence
    # [1, 1, tokens, tokens] bool when prefixes are shared; None: the sequences lie apart
    # and transformers masks between them from `position_ids`.
    attention_mask: torch.Tensor | None
    predict_at: torch.Tensor  # [n]: positions whose hidden state predicts a trained token
    targets: torch.Tensor  # [n]: those trained tokens
    layout: tuple[torch.Tensor, torch.Tensor]  # [n] row (sequence) and column of each
    # [sequences, width]: the loss's view, one row per sequence, its trained tokens in order.
    mask: torch.Tensor
    old_logprobs: torch.Tensor  # the sampler's, NaN where unknown
    advantages: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def per_sequence(self, flat: torch.Tensor) -> torch.Tensor:
        """`flat` ([n], one value per trained token) as [sequences, width], 0 elsewhere."""
        return flat.new_zeros(self.mask.shape).index_put(self.layout, flat)

    @classmethod
    def of(
        cls,
        sequences: Sequence[TrainingSequence],
        advantages: dict[tuple[int, int], float],
        device: torch.device,
        *,
        share_prefixes: bool = False,
    ) -> MicroBatch:
        ids: list[int] = []
        positions: list[int] = []
        where: list[Sequence[int]] = []  # each sequence's tokens' indices in the row
        attention_mask: torch.Tensor | None = None
        tree = PrefixTree.of([s.token_ids for s in sequences]) if share_prefixes else None
        if tree is not None and tree.shared:
            ids, positions, where = tree.token_ids, tree.positions, list(tree.where)
            attention_mask = tree.attention_mask(device)
        else:  # nothing shared: the plain packed row, whose mask transformers builds
            for sequence in sequences:
                where.append(range(len(ids), len(ids) + len(sequence.token_ids)))
                ids += sequence.token_ids
                positions += range(len(sequence.token_ids))
        predict_at: list[int] = []
        targets: list[int] = []
        rows: list[int] = []
        columns: list[int] = []
        old: list[float] = []
        row_advantages: list[float] = []
        for row, sequence in enumerate(sequences):
            column = 0
            # Token 0 of a sequence is predicted by nothing in it; token t by the hidden
            # state at token t - 1, which for the first token after a shared prefix is
            # the prefix's last (shared) hidden state.
            for t in range(1, len(sequence.token_ids)):
                if sequence.trained[t]:
                    predict_at.append(where[row][t - 1])
                    targets.append(sequence.token_ids[t])
                    rows.append(row)
                    columns.append(column)
                    old.append(sequence.sampler_logprobs[t])
                    column += 1
            row_advantages.append(advantages[sequence.group_index, sequence.trajectory_index])
        shape = (len(sequences), max(columns, default=-1) + 1)
        layout = (torch.tensor(rows, dtype=torch.long), torch.tensor(columns, dtype=torch.long))
        mask = torch.zeros(shape).index_put(layout, torch.ones(len(rows)))
        old_logprobs = torch.full(shape, math.nan).index_put(
            layout, torch.tensor(old, dtype=torch.float32)
        )
        advantage = torch.tensor(row_advantages, dtype=torch.float32)[:, None].expand(shape)
        return cls(
            input_ids=torch.tensor([ids], dtype=torch.long, device=device),
            position_ids=torch.tensor([positions], dtype=torch.long, device=device),
            attention_mask=attention_mask,
            predict_at=torch.tensor(predict_at, dtype=torch.long, device=device),
            targets=torch.tensor(targets, dtype=torch.long, device=device),
            layout=(layout[0].to(device), layout[1].to(device)),
            mask=mask.to(device),
            old_logprobs=old_logprobs.to(device),
            advantages=advantage.contiguous().to(device),
        )


__all__ = ["PACKED_ROW_TOKENS", "MicroBatch", "pack"]
