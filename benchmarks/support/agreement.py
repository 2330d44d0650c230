"""Pairwise agreement of a scorer with hand-given scores, and its interval over groups."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence


def pairwise_agreement(true: Sequence[float], predicted: Sequence[float]) -> tuple[float, int]:
    """Credit summed over the pairs whose true scores differ, and how many such pairs."""
    credit, pairs = 0.0, 0
    for i, j in itertools.combinations(range(len(true)), 2):
        if true[i] == true[j]:
            continue
        pairs += 1
        if predicted[i] == predicted[j]:
            credit += 0.5
        elif (predicted[i] > predicted[j]) == (true[i] > true[j]):
            credit += 1.0
    return credit, pairs


def accuracy_and_interval(
    per_group: Sequence[tuple[float, int]], draws: int = 2000, seed: int = 0
) -> tuple[float, float, float, int]:
    """Pairwise accuracy over all groups, its 95% bootstrap interval (groups resampled,
    since the pairs of one group are not independent of each other), and the pairs."""
    credit = sum(c for c, _ in per_group)
    pairs = sum(p for _, p in per_group)
    if not pairs:
        return float("nan"), float("nan"), float("nan"), 0
    rng = random.Random(seed)
    samples = []
    for _ in range(draws):
        chosen = [per_group[rng.randrange(len(per_group))] for _ in per_group]
        n = sum(p for _, p in chosen)
        if n:
            samples.append(sum(c for c, _ in chosen) / n)
    samples.sort()
    low, high = samples[int(0.025 * len(samples))], samples[int(0.975 * len(samples)) - 1]
    return credit / pairs, low, high, pairs
