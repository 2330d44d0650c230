"""Shared prefixes trained once: the sequences of a micro-batch laid out as a prefix tree.

In a GRPO group every rollout begins with the same prompt, so most of a step's tokens
are that prompt k times over. A causal LM's hidden state at a token depends only on the
tokens up to it and their positions, so sequences that agree up to some token have the
same hidden states up to there. `PrefixTree` lays a micro-batch out as one row holding
each distinct prefix once (a trie of the token ids: a shared system prompt, a group's
shared question, a shared first turn of multi-turn rollouts) and gives the attention
mask under which every token sees exactly the tokens of its own sequences before it.
The forward and backward then run over the distinct tokens only; the gradient that
reaches a shared token is the sum of what every sequence through it sends back, as if
each sequence had been run alone. No token is padding, none is computed twice.

Why a tree in one row and not a prompt's KV cache expanded over k padded suffix rows:
the row needs no padding whatever the suffix lengths, one forward call covers the whole
micro-batch, and prefixes shared at any depth (across groups, inside a multi-turn
conversation) are found the same way. Its price: under the mask each token's attention
spans the whole row (`DENSE_ROW_TOKENS`), so trees are kept one to a micro-batch and
stop growing where that costs more than it saves (`worth_joining`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Under a 4D mask, attention computes every (query, key) pair of the row, masked or not
# (SDPA's CPU kernel skips nothing but a plain causal mask's upper triangle). Measured on
# the default model in bf16 on a CPU (torch 2.13, one thread), a row of T tokens costs
# about as much as T + T**2 / DENSE_ROW_TOKENS tokens would without that: at 200 tokens
# the attention adds a third, at 700 more than the whole rest of the forward and backward.
DENSE_ROW_TOKENS = 630


class PrefixTrie:
    """A trie of token sequences, grown one sequence at a time; each node is one row index."""

    def __init__(self) -> None:
        # (row index of the parent token, or -1 at the root; token id) -> row index
        self._children: dict[tuple[int, int], int] = {}
        self.token_ids: list[int] = []
        self.positions: list[int] = []

    def new_tokens(self, sequence: Sequence[int]) -> int:
        """How many tokens adding `sequence` would add (its length less its known prefix)."""
        parent = -1
        for matched, token in enumerate(sequence):
            index = self._children.get((parent, token))
            if index is None:
                return len(sequence) - matched
            parent = index
        return 0

    def add(self, sequence: Sequence[int]) -> list[int]:
        """Add `sequence`; return the row index of each of its tokens."""
        path: list[int] = []
        parent = -1
        for position, token in enumerate(sequence):
            index = self._children.get((parent, token))
            if index is None:
                index = len(self.token_ids)
                self._children[parent, token] = index
                self.token_ids.append(token)
                self.positions.append(position)
            path.append(index)
            parent = index
        return path


@dataclass(frozen=True)
class PrefixTree:
    """Sequences laid out in one row, each distinct prefix once (parents before children)."""

    token_ids: list[int]  # the row
    positions: list[int]  # each token's position within the sequences that hold it
    where: list[list[int]]  # for each sequence, the row index of each of its tokens

    @classmethod
    def of(cls, sequences: Sequence[Sequence[int]]) -> PrefixTree:
        trie = PrefixTrie()
        where = [trie.add(sequence) for sequence in sequences]
        return cls(trie.token_ids, trie.positions, where)

    @property
    def shared(self) -> bool:
        """Whether any token stands for more than one sequence."""
        return len(self.token_ids) < sum(len(path) for path in self.where)

    def attention_mask(self, device: torch.device) -> torch.Tensor:
        """[1, 1, tokens, tokens] bool, True where a token may attend: its sequences' earlier
        tokens and itself. A 4D mask transformers passes to the attention as it is."""
        size = len(self.token_ids)
        allowed = torch.zeros(size, size, dtype=torch.bool)
        for path in self.where:
            index = torch.tensor(path, dtype=torch.long)
            # Along a sequence the row indices increase, so "before it in the sequence" is
            # the lower triangle of the sequence's own rows and columns.
            causal = torch.ones(len(path), len(path), dtype=torch.bool).tril_()
            allowed[index[:, None], index[None, :]] |= causal
        return allowed[None, None].to(device)


def row_cost(tokens: int) -> float:
    """What training one prefix-tree row of `tokens` tokens costs, in plain tokens."""
    return tokens + tokens * tokens / DENSE_ROW_TOKENS


def worth_joining(row_tokens: int, new_tokens: int, length: int) -> bool:
    """Whether a sequence of `length` tokens, of which `new_tokens` are not in a tree row
    of `row_tokens` yet, trains for less in that row than by starting a row of its own."""
    return row_cost(row_tokens + new_tokens) - row_cost(row_tokens) <= row_cost(length)


def distinct_tokens(sequences: Sequence[Sequence[int]]) -> int:
    """Tokens of `sequences` laid out as a prefix tree: what a forward over them computes."""
    trie = PrefixTrie()
    for sequence in sequences:
        trie.add(sequence)
    return len(trie.token_ids)


__all__ = [
    "DENSE_ROW_TOKENS",
    "PrefixTree",
    "PrefixTrie",
    "distinct_tokens",
    "row_cost",
    "worth_joining",
]
