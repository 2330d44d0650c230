"""Keys and values of prompt prefixes that many requests share, prefilled once.

Requests of one workload share long prompt prefixes: a system prompt, a tool list, the
conversation so far of an agent's next turn. On a CPU a prefilled token costs about
what a decoded one does (both are compute-bound at a batch of 32), and the shared part
is most of a prompt (24 of the default model's ~39 template tokens for a one-line user
message), so prefilling it once per request is most of the prefill work.

A prefix is kept once two prompts seen are found to share it (at least `min_tokens`
tokens, not the whole of either, and `min_tokens` more than the longest cached prefix):
the longest common prefix of a new prompt with the other prompts of its prefill and the
last `remembered` prompts. A prefix several prompts of one prefill share is prefilled once,
in a call of its own; one that only a single prompt of the prefill has (its own earlier
self, or a conversation's last turn) is kept from that prompt's prefill, which costs no
call more (`BatchDecoder.prefill`). Entries are per adapter
and dropped whenever the weights change (`clear`); the least recently used goes first
beyond `capacity` entries or `max_bytes` of keys and values (an agent's conversation of
4k tokens holds ~90 MB of the default model's), and a prefix larger than `max_bytes`
alone is used for its prefill but not kept. The cached keys and values are those a prefill of the prefix alone
computes, which is what a full-prompt prefill computes for those positions: attention
is causal, so no position sees what follows it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable

import torch

# One layer's cached keys and values for the prefix, each [1, kv heads, tokens, head dim].
LayerKV = tuple[torch.Tensor, torch.Tensor]
Prompt = tuple[int, ...]


class PrefixCache:
    """Shared prompt prefixes and their keys and values, per adapter."""

    def __init__(
        self,
        min_tokens: int = 16,
        capacity: int = 16,
        remembered: int = 64,
        max_bytes: int = 256 << 20,
    ) -> None:
        self.min_tokens = min_tokens
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.bytes = 0  # of the cached keys and values
        self._entries: OrderedDict[tuple[str | None, Prompt], list[LayerKV]] = OrderedDict()
        self._recent: deque[Prompt] = deque(maxlen=remembered)
        self.saved = 0  # prefill tokens not computed: taken from the cache or shared in a batch

    def clear(self) -> None:
        """The weights changed: no cached prefix is valid any more."""
        self._entries.clear()
        self.bytes = 0

    def prefix_of(self, prompt: Prompt, neighbours: Iterable[Prompt], adapter: str | None) -> int:
        """Tokens of `prompt` to take from the cache (or to prefill into it first): the
        longest prefix shared with a neighbour or a recent prompt where that extends the
        longest cached prefix by at least `min_tokens`, else the cached one; 0 where that
        is shorter than `min_tokens`. Always at least one token short of the prompt, whose
        last position must run to give the next token's logits.

        (A new entry costs a model call of its own: prompts of one template that go on to
        share a word or two, "Write a", are not worth one.)
        """
        cached = self.longest(adapter, prompt)
        cached_length = min(cached[0] if cached is not None else 0, len(prompt) - 1)
        shared = 0
        for other in [*neighbours, *self._recent]:
            if other is not prompt:
                shared = max(shared, _common_length(prompt, other))
        shared = min(shared, len(prompt) - 1)
        best = shared if shared >= cached_length + self.min_tokens else cached_length
        return best if best >= self.min_tokens else 0

    def coarsened(self, prefixes: Iterable[Prompt]) -> dict[Prompt, Prompt]:
        """Each non-empty prefix mapped to the prefix its prompts are prefilled from: the
        prefixes' longest common prefix where they extend it by fewer than `min_tokens`
        (and it has at least that many), else itself.

        Each distinct prefix is a prefill call of its own, whose fixed cost (~15-35 ms for
        the default model on 2 cores) outweighs a few more tokens per prompt: prompts of one
        template that go on to share a word or two are prefilled in one call.
        """
        given = [prefix for prefix in dict.fromkeys(prefixes) if prefix]
        if len(given) < 2:
            return {prefix: prefix for prefix in given}
        common = given[0]
        for prefix in given[1:]:
            common = common[: _common_length(common, prefix)]
        if len(common) < self.min_tokens:
            return {prefix: prefix for prefix in given}
        return {
            prefix: common if len(prefix) - len(common) < self.min_tokens else prefix
            for prefix in given
        }

    def remember(self, prompt: Prompt) -> None:
        """`prompt` was prefilled: later prompts may share a prefix with it."""
        self._recent.append(prompt)

    def longest(self, adapter: str | None, prompt: Prompt) -> tuple[int, list[LayerKV]] | None:
        """The longest cached prefix of `prompt` (or `prompt` itself): its length and layers."""
        best: tuple[Prompt, list[LayerKV]] | None = None
        for (cached_adapter, prefix), layers in self._entries.items():
            fits = len(prefix) <= len(prompt) and prompt[: len(prefix)] == prefix
            if cached_adapter == adapter and fits and (best is None or len(prefix) > len(best[0])):
                best = prefix, layers
        if best is None:
            return None
        self._entries.move_to_end((adapter, best[0]))
        return len(best[0]), best[1]

    def put(self, adapter: str | None, prefix: Prompt, layers: list[LayerKV]) -> None:
        size = _nbytes(layers)
        if size > self.max_bytes or (adapter, prefix) in self._entries:
            return
        self._entries[adapter, prefix] = layers
        self.bytes += size
        while len(self._entries) > self.capacity or self.bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self.bytes -= _nbytes(dropped)


def _nbytes(layers: list[LayerKV]) -> int:
    return sum(keys.nbytes + values.nbytes for keys, values in layers)


def _common_length(a: Prompt, b: Prompt) -> int:
    """Length of the common prefix, by bisection over slice comparisons (which run in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


__all__ = ["LayerKV", "PrefixCache"]
