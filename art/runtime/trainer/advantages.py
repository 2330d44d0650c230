"""Group-relative advantages: how much better each rollout did than its siblings (GRPO)."""

from __future__ import annotations

import math
from collections.abc import Sequence

_STD_EPSILON = 1e-6


def group_advantages(rewards: Sequence[float], *, scale: bool) -> list[float]:
    """Each reward minus the group's mean, divided by the group's std when `scale`.

    A group whose rewards are all equal gets exact zeros, so it trains nothing.
    """
    if not rewards or min(rewards) == max(rewards):
        return [0.0] * len(rewards)
    mean = math.fsum(rewards) / len(rewards)
    centered = [reward - mean for reward in rewards]
    if not scale:
        # Dr. GRPO (arXiv:2503.20783): dividing by the std weights near-uniform groups
        # (all but one right, or all but one wrong) most heavily, a difficulty bias.
        return centered
    std = math.sqrt(math.fsum(value * value for value in centered) / len(centered))
    return [value / (std + _STD_EPSILON) for value in centered]


def balanced(advantage: float, balance: float) -> float:
    """ART's advantage_balance in [-1, 1]: above 0 a negative advantage is multiplied by
    1 - balance, below 0 a positive one by 1 + balance; the other sign is kept."""
    if balance > 0 and advantage < 0:
        return advantage * (1.0 - balance)
    if balance < 0 and advantage > 0:
        return advantage * (1.0 + balance)
    return advantage


__all__ = ["balanced", "group_advantages"]
