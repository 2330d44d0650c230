"""Group-relative advantages, worked by hand."""

from __future__ import annotations

import math

import pytest

from art.runtime.trainer.advantages import balanced, group_advantages


def test_unscaled_advantages_are_rewards_minus_the_group_mean() -> None:
    # mean of [1, 0, 0, 3] is 1
    assert group_advantages([1.0, 0.0, 0.0, 3.0], scale=False) == [0.0, -1.0, -1.0, 2.0]


def test_scaled_advantages_divide_by_the_population_std() -> None:
    # mean 0.5, deviations +-0.5, population std 0.5
    advantages = group_advantages([1.0, 0.0, 1.0, 0.0], scale=True)
    expected = 0.5 / (0.5 + 1e-6)
    assert advantages == pytest.approx([expected, -expected, expected, -expected], rel=1e-12)
    assert math.fsum(advantages) == pytest.approx(0.0, abs=1e-12)


def test_a_group_without_reward_variance_gets_exact_zeros() -> None:
    # 0.1 * 3 is not exactly 0.3 in floating point; the zeros must still be exact.
    for scale in (True, False):
        assert group_advantages([0.1, 0.1, 0.1], scale=scale) == [0.0, 0.0, 0.0]
        assert group_advantages([5.0], scale=scale) == [0.0]
        assert group_advantages([], scale=scale) == []


def test_advantage_balance_scales_one_sign_as_arts_does() -> None:
    assert [balanced(a, 0.25) for a in (-2.0, 2.0)] == [-1.5, 2.0]
    assert [balanced(a, -0.25) for a in (-2.0, 2.0)] == [-2.0, 1.5]
    assert [balanced(a, 1.0) for a in (-2.0, 2.0)] == [0.0, 2.0]  # only rewarded ones train
    assert [balanced(a, 0.0) for a in (-2.0, 2.0)] == [-2.0, 2.0]
