"""Sticky routing: the turns of one conversation go to the replica that served the last.

A multi-turn rollout's next prompt is its last prompt, the sampled reply, and the new
turn, re-rendered and re-tokenized. So after each reply the router records which replica
holds the prompt plus the reply's first tokens (at several cut points, because a reply's
sampled tokens need not re-tokenize identically to the end), and a new prompt goes to
the replica of the longest recorded prefix it extends. The prompt alone is not recorded:
the rollouts of one group share their first prompt and should spread over the replicas,
then each stays on its own.

A reply whose first token merges with the template text before it once re-rendered (a
sampled leading newline after the template's own) leaves no recorded prefix that the
next prompt extends: that turn is routed by load, like a new conversation.

Prefixes are keyed by (length, polynomial hash); a bounded LRU keeps memory flat.
"""

from __future__ import annotations

from collections import OrderedDict

_MODULUS = (1 << 61) - 1  # a Mersenne prime: collisions are ~2**-61 per comparison
_BASE = 1_000_003
_CUT_EVERY = 8  # reply tokens between recorded cut points


def prefix_hashes(token_ids: list[int]) -> list[int]:
    """`hashes[i]` is the hash of `token_ids[:i]` (so `hashes[0]` is the empty prefix's)."""
    hashes = [0]
    value = 0
    for token in token_ids:
        value = (value * _BASE + token + 1) % _MODULUS
        hashes.append(value)
    return hashes


class StickyTable:
    """Which replica holds which conversation prefix."""

    def __init__(self, capacity: int = 65536) -> None:
        self.capacity = capacity
        self._owner: OrderedDict[tuple[int, int], int] = OrderedDict()

    def record(self, prompt_ids: list[int], reply_ids: list[int], replica: int) -> None:
        """`replica` served `reply_ids` after `prompt_ids`: prompts extending them go there."""
        hashes = prefix_hashes(prompt_ids + reply_ids)
        start = len(prompt_ids)
        cuts = {
            start + len(reply_ids),
            *range(start + _CUT_EVERY, start + len(reply_ids), _CUT_EVERY),
        }
        for length in cuts:
            if length <= start:
                continue  # the bare prompt is shared by a group's rollouts
            key = (length, hashes[length])
            self._owner[key] = replica
            self._owner.move_to_end(key)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)

    def find(self, prompt_ids: list[int]) -> int | None:
        """The replica holding the longest recorded prefix of `prompt_ids`, if any."""
        hashes = prefix_hashes(prompt_ids)
        for length in range(len(prompt_ids), 0, -1):
            replica = self._owner.get((length, hashes[length]))
            if replica is not None:
                return replica
        return None

    def forget(self, replica: int) -> None:
        """Drop a dead replica's prefixes: its successor starts with an empty cache."""
        for key in [key for key, owner in self._owner.items() if owner == replica]:
            del self._owner[key]


__all__ = ["StickyTable", "prefix_hashes"]
