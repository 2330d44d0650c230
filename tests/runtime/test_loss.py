"""The GRPO-family loss on hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import art
from art.runtime.trainer.loss import (
    LossConfig,
    grpo_loss,
    importance_ratio,
    kl_k3,
    masked_mean,
)


def _tensor(*values: float) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64)


def _grad(
    config: LossConfig, new: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> tuple[float, torch.Tensor]:
    new = new.clone().requires_grad_(True)
    result = grpo_loss(new, old, adv, mask, config)
    result.loss.backward()
    assert new.grad is not None
    return float(result.loss.detach()), new.grad


def test_masked_mean_ignores_masked_tokens_even_when_they_are_not_finite() -> None:
    values = _tensor(1.0, 3.0, math.nan, math.inf)
    assert float(masked_mean(values, _tensor(1, 1, 0, 0))) == 2.0
    assert float(masked_mean(values, _tensor(0, 0, 0, 0))) == 0.0
    rows = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert_close(masked_mean(rows, mask, dim=-1), torch.tensor([1.5, 4.0]))
    # token-level over the batch: (1 + 2 + 4) / 3, not the mean of the row means
    assert float(masked_mean(rows, mask)) == pytest.approx(7 / 3)


@pytest.mark.parametrize("ppo", [True, False])
def test_at_ratio_one_the_gradient_is_the_policy_gradient(ppo: bool) -> None:
    logp = _tensor(-0.5, -1.0, -2.0, -0.1)
    adv = _tensor(1.0, -1.0, 2.0, 5.0)
    mask = _tensor(1, 1, 1, 0)  # the last token is not trained
    loss, grad = _grad(LossConfig(ppo=ppo), logp, logp.clone(), adv, mask)
    if ppo:
        # -mean(r * A) with r = 1 over the 3 trained tokens: -(1 - 1 + 2) / 3
        assert loss == pytest.approx(-2 / 3)
    else:
        # CISPO's value is -mean(w * A * logp): -(1*-0.5 + -1*-1.0 + 2*-2.0) / 3 = 3.5 / 3
        assert loss == pytest.approx(3.5 / 3)
    # d loss / d logp_t = -A_t / N for both: REINFORCE with advantages
    assert_close(grad, _tensor(-1 / 3, 1 / 3, -2 / 3, 0.0))


def test_ppo_clips_in_the_direction_the_advantage_pushes() -> None:
    # eps = 0.2, eps_high = 0.3: the ratio is kept within [0.8, 1.3]
    config = LossConfig(ppo=True, epsilon=0.2, epsilon_high=0.3)
    old = _tensor(-1.0, -1.0, -1.0, -1.0)
    ratios = _tensor(1.5, 1.5, 0.5, 0.5)
    new = old + ratios.log()
    adv = _tensor(1.0, -1.0, 1.0, -1.0)
    mask = _tensor(1, 1, 1, 1)
    # token 0: r=1.5, A=+1: min(1.5, 1.3) = 1.3  -> loss -1.3, clipped, no gradient
    # token 1: r=1.5, A=-1: min(-1.5, -1.3) = -1.5 -> loss 1.5, gradient -r*A = 1.5
    # token 2: r=0.5, A=+1: min(0.5, 0.8) = 0.5  -> loss -0.5, gradient -0.5
    # token 3: r=0.5, A=-1: min(-0.5, -0.8) = -0.8 -> loss 0.8, clipped, no gradient
    # mean: (-1.3 + 1.5 - 0.5 + 0.8) / 4 = 0.125
    loss, grad = _grad(config, new, old, adv, mask)
    assert loss == pytest.approx(0.125)
    assert_close(grad, _tensor(0.0, 1.5, -0.5, 0.0) / 4)
    result = grpo_loss(new, old, adv, mask, config)
    assert float(result.clip_fraction) == 0.5
    assert float(result.mean_ratio) == pytest.approx(1.0)  # (1.5 + 1.5 + 0.5 + 0.5) / 4


def test_cispo_clips_the_weight_but_keeps_every_gradient() -> None:
    config = LossConfig(ppo=False, epsilon=0.2, epsilon_high=0.3)
    old = _tensor(-1.0, -1.0, -1.0, -1.0)
    new = old + _tensor(1.5, 1.5, 0.5, 0.5).log()
    adv = _tensor(1.0, -1.0, 1.0, -1.0)
    # weights clip(r) = [1.3, 1.3, 0.8, 0.8]; d/dlogp of -(w * A * logp) = -w * A
    loss, grad = _grad(config, new, old, adv, _tensor(1, 1, 1, 1))
    assert_close(grad, _tensor(-1.3, 1.3, -0.8, 0.8) / 4)
    # logp = -1 + log r: -(1.3*(-1+log1.5) - 1.3*(-1+log1.5) + 0.8*(-1+log.5) - 0.8*(-1+log.5)) = 0
    assert loss == pytest.approx(0.0, abs=1e-12)
    result = grpo_loss(new, old, adv, _tensor(1, 1, 1, 1), config)
    assert float(result.clip_fraction) == 1.0


def test_sequence_level_ratio_is_the_geometric_mean_over_trained_tokens() -> None:
    old = _tensor(-1.0, -1.0, -1.0)
    new = old + _tensor(2.0, 0.5, 7.0).log()
    token = importance_ratio(new, old, _tensor(1, 1, 0), "token")
    assert_close(token, _tensor(2.0, 0.5, 7.0))
    # exp(mean(log 2, log 0.5)) = 1, broadcast to every token; the masked 7 does not count
    sequence = importance_ratio(new, old, _tensor(1, 1, 0), "sequence")
    assert_close(sequence, _tensor(1.0, 1.0, 1.0))
    assert_close(importance_ratio(new, old, _tensor(1, 0, 0), "sequence"), _tensor(2.0, 2.0, 2.0))
    # rows are separate sequences: sqrt(2 * 8) = 4 and sqrt(0.5 * 0.5) = 0.5
    old2 = torch.zeros(2, 2, dtype=torch.float64)
    new2 = torch.tensor([[2.0, 8.0], [0.5, 0.5]], dtype=torch.float64).log()
    ratio = importance_ratio(new2, old2, torch.ones(2, 2, dtype=torch.float64), "sequence")
    assert_close(ratio, torch.tensor([[4.0, 4.0], [0.5, 0.5]], dtype=torch.float64))


def test_unknown_sampler_logprobs_give_ratio_one() -> None:
    logp = _tensor(-0.5, -1.0, -2.0)
    old = _tensor(math.nan, -1.0 - math.log(2.0), math.nan)
    assert_close(importance_ratio(logp, old, _tensor(1, 1, 1)), _tensor(1.0, 2.0, 1.0))
    # with every sampler logprob unknown, the gradient is the plain policy gradient
    adv = _tensor(1.0, 1.0, -1.0)
    nan = _tensor(math.nan, math.nan, math.nan)
    loss, grad = _grad(LossConfig(ppo=True), logp, nan, adv, _tensor(1, 1, 1))
    assert loss == pytest.approx(-1 / 3)
    assert_close(grad, _tensor(-1 / 3, -1 / 3, 1 / 3))
    assert not torch.isnan(grad).any()


def test_k3_kl_is_zero_when_equal_and_positive_otherwise() -> None:
    logp = _tensor(-0.5, -1.0, -2.0)
    assert_close(kl_k3(logp, logp), _tensor(0.0, 0.0, 0.0))
    # ref - new = log 2: 2 - log 2 - 1;  ref - new = -log 2: 0.5 + log 2 - 1
    kl = kl_k3(_tensor(0.0, 0.0), _tensor(math.log(2.0), -math.log(2.0)))
    assert_close(kl, _tensor(1.0 - math.log(2.0), math.log(2.0) - 0.5))
    assert (kl > 0).all()


def test_kl_penalty_adds_beta_times_kl_to_the_loss() -> None:
    config = LossConfig(ppo=True, beta=0.5)
    new = _tensor(0.0, 0.0)
    ref = _tensor(math.log(2.0), math.log(2.0))
    mask = _tensor(1, 1)
    result = grpo_loss(new, new.clone(), _tensor(1.0, 1.0), mask, config, ref)
    assert result.kl is not None
    assert float(result.kl) == pytest.approx(1.0 - math.log(2.0))
    assert float(result.loss) == pytest.approx(-1.0 + 0.5 * (1.0 - math.log(2.0)))
    assert grpo_loss(new, new, _tensor(1.0, 1.0), mask, LossConfig()).kl is None
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(new, new, _tensor(1.0, 1.0), mask, config)


def test_loss_config_reads_both_train_configs() -> None:
    config = LossConfig.from_configs(
        art.TrainConfig(learning_rate=1e-5, beta=0.1),
        art.dev.TrainConfig(
            ppo=True, epsilon=0.1, epsilon_high=0.28, importance_sampling_level="sequence"
        ),
    )
    assert config == LossConfig(True, 0.1, 0.28, "sequence", 0.1)
    assert (config.lower, config.upper) == (0.9, 1.28)
    assert LossConfig(epsilon=0.2).upper == 1.2


# --- ART's shapings (facts from ART 0.5.18's art/loss.py; each on numbers worked by hand) ---


def test_average_and_geometric_average_mix_the_token_and_sequence_ratios() -> None:
    new, old = _tensor(math.log(2.0), 0.0), _tensor(0.0, 0.0)
    mask = _tensor(1, 1)
    # Token ratios 2 and 1; the sequence ratio is exp(mean log-ratio) = sqrt(2).
    root = math.sqrt(2.0)
    assert_close(
        importance_ratio(new, old, mask, "average"), _tensor((2 + root) / 2, (1 + root) / 2)
    )
    assert_close(
        importance_ratio(new, old, mask, "geometric_average"),
        _tensor(math.sqrt(2 * root), math.sqrt(root)),
    )


def test_the_ratio_is_capped_and_masked_outside_the_clip_range() -> None:
    new, old = _tensor(math.log(3.0), math.log(1.1), 0.0), _tensor(0.0, 0.0, 0.0)
    adv, mask = _tensor(1.0, 1.0, 1.0), _tensor(1, 1, 1)
    capped = grpo_loss(new, old, adv, mask, LossConfig(ppo=True, epsilon=5.0, max_ratio=2.0))
    assert float(capped.mean_ratio) == pytest.approx((2.0 + 1.1 + 1.0) / 3)
    # mask_ratio: the token at ratio 3 (outside [0.8, 1.2]) weighs 0, so takes no gradient.
    loss, grad = _grad(LossConfig(ppo=True, mask_ratio=True), new, old, adv, mask)
    assert float(grad[0, 0]) == 0.0
    assert float(grad[0, 1]) != 0.0
    assert loss == pytest.approx(-(0 + 1.1 + 1.0) / 3)


def test_kimi_k2_tau_lowers_the_advantage_by_the_log_ratio() -> None:
    new, old = _tensor(math.log(2.0), 0.0), _tensor(0.0, 0.0)
    adv, mask = _tensor(1.0, 1.0), _tensor(1, 1)
    plain = grpo_loss(new, old, adv, mask, LossConfig(ppo=True, epsilon=5.0))
    shaped = grpo_loss(new, old, adv, mask, LossConfig(ppo=True, epsilon=5.0, kimi_k2_tau=0.5))
    # PPO's per-token loss is -ratio * advantage: token 0's advantage is 1 - 0.5 ln 2.
    expected = -(2.0 * (1.0 - 0.5 * math.log(2.0)) + 1.0) / 2
    assert float(shaped.loss) == pytest.approx(expected)
    assert float(plain.loss) == pytest.approx(-(2.0 + 1.0) / 2)


def test_kl_penalty_coef_shifts_advantages_towards_the_tokens_that_moved_least() -> None:
    new, ref = _tensor(math.log(2.0), 0.0), _tensor(0.0, 0.0)
    adv, mask = _tensor(1.0, 1.0), _tensor(1, 1)
    config = LossConfig(ppo=True, epsilon=5.0, kl_penalty_coef=1.0)
    result = grpo_loss(new, new.clone(), adv, mask, config, ref)
    # Log-ratios to the base: ln 2 and 0, mean ln2/2; advantages 1 - ln2/2 and 1 + ln2/2.
    assert result.kl_policy_ref is not None
    assert float(result.kl_policy_ref) == pytest.approx(math.log(2.0) / 2)
    # At ratio 1, PPO's gradient per token is -advantage / tokens: the moved token is held back.
    leaf = new.clone().requires_grad_(True)
    grpo_loss(leaf, new.clone(), adv, mask, config, ref).loss.backward()
    assert leaf.grad is not None
    assert_close(leaf.grad, _tensor(-(1 - math.log(2) / 2) / 2, -(1 + math.log(2) / 2) / 2))
    with pytest.raises(ValueError, match="kl_penalty_coef"):
        grpo_loss(new, new, adv, mask, config)
    assert LossConfig.from_configs(
        art.TrainConfig(kl_penalty_coef=0.3),
        art.dev.TrainConfig(
            mask_prob_ratio=True,
            kimi_k2_tau=0.1,
            max_negative_advantage_importance_sampling_weight=4.0,
        ),
    ) == LossConfig(kl_penalty_coef=0.3, mask_ratio=True, kimi_k2_tau=0.1, max_ratio=4.0)


def test_truncated_importance_sampling_weighs_each_tokens_loss_by_its_capped_ratio() -> None:
    new, old = _tensor(math.log(2.0), math.log(0.5)), _tensor(0.0, 0.0)
    adv, mask = _tensor(1.0, 1.0), _tensor(1, 1)
    config = LossConfig(ppo=True, epsilon=5.0, truncated_is=1.5)
    # PPO's per-token loss is -ratio * advantage (2 and 0.5), times min(ratio, 1.5).
    tis = grpo_loss(new, old, adv, mask, config)
    assert float(tis.loss) == pytest.approx(-(2.0 * 1.5 + 0.5 * 0.5) / 2)
    # With the trainer's own logprobs as old ones (ratio 1), the weight is trainer/sampler.
    sampler = _tensor(math.log(0.25), 0.0)
    precalculated = grpo_loss(new, new.detach(), adv, mask, config, sampler_logprobs=sampler)
    # Token 0: trainer/sampler = 2 / 0.25 = 8, capped at 1.5; token 1: 0.5.
    assert float(precalculated.loss) == pytest.approx(-(1.0 * 1.5 + 1.0 * 0.5) / 2)
    assert LossConfig.from_configs(
        art.TrainConfig(), art.dev.TrainConfig(truncated_importance_sampling=2.0)
    ) == LossConfig(truncated_is=2.0)
