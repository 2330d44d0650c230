"""The GRPO-family loss: pure functions of tensors and a frozen config.

Shapes: every per-token tensor is `[batch, tokens]`, aligned so position `t` holds the
log-probability of token `t` of the trained sequence. `mask` is 1.0 on the tokens the
model sampled itself (the ones trained) and 0.0 elsewhere.

Means are token-level over every trained token of the batch, not per sequence first,
so a long answer is not down-weighted against a short one (DAPO, arXiv:2503.14476).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ...core.data import dev
from ...core.data.types import TrainConfig


@dataclass(frozen=True)
class LossConfig:
    """The knobs of the objective, gathered from `art.TrainConfig` and `art.dev.TrainConfig`."""

    ppo: bool = False  # PPO's clipped surrogate; False uses CISPO
    epsilon: float = 0.2  # lower clip range: 1 - epsilon
    epsilon_high: float | None = None  # upper clip range: 1 + epsilon_high; None uses epsilon
    importance_sampling_level: Literal["token", "sequence", "average", "geometric_average"] = (
        "token"
    )
    beta: float = 0.0  # weight of the KL penalty towards the base model
    max_ratio: float | None = None  # ART's max_negative_advantage_importance_sampling_weight
    mask_ratio: bool = False  # ART's mask_prob_ratio: no gradient outside the clip range
    kimi_k2_tau: float | None = None
    kl_penalty_coef: float = 0.0  # ART's KL-penalised advantage, towards the base model
    # Whose logprobs that advantage compares with the base's: the learner's or the sampler's.
    kl_penalty_source: Literal["current_learner", "sample"] = "current_learner"
    truncated_is: float | None = None  # ART's truncated_importance_sampling bound

    @property
    def needs_reference(self) -> bool:
        """Whether the base model's logprobs enter the loss."""
        return self.beta > 0 or self.kl_penalty_coef > 0

    @classmethod
    def from_configs(cls, config: TrainConfig, dev_config: dev.TrainConfig) -> LossConfig:
        return cls(
            ppo=dev_config.ppo,
            epsilon=dev_config.epsilon,
            epsilon_high=dev_config.epsilon_high,
            importance_sampling_level=dev_config.importance_sampling_level,
            beta=config.beta,
            max_ratio=dev_config.max_negative_advantage_importance_sampling_weight,
            mask_ratio=dev_config.mask_prob_ratio,
            kimi_k2_tau=dev_config.kimi_k2_tau,
            kl_penalty_coef=config.kl_penalty_coef,
            kl_penalty_source=config.kl_penalty_source,
            truncated_is=dev_config.truncated_importance_sampling,
        )

    @property
    def upper(self) -> float:
        return 1.0 + (self.epsilon if self.epsilon_high is None else self.epsilon_high)

    @property
    def lower(self) -> float:
        return 1.0 - self.epsilon


@dataclass(frozen=True)
class LossResult:
    """The loss to differentiate, and detached metrics of the same batch."""

    loss: torch.Tensor  # policy_loss + beta * kl
    policy_loss: torch.Tensor
    kl: torch.Tensor | None  # mean k3 KL to the base model; None when beta is 0
    kl_policy_ref: torch.Tensor | None  # mean log-ratio to the base (kl_penalty_coef > 0)
    clip_fraction: torch.Tensor  # share of trained tokens whose importance weight was clipped
    mean_ratio: torch.Tensor  # mean importance ratio over trained tokens


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor, dim: int | None = None, keepdim: bool = False
) -> torch.Tensor:
    """Mean of `values` where `mask` is 1; 0 where nothing is masked in. NaNs outside are ignored."""
    kept = torch.where(mask > 0, values, torch.zeros_like(values)) * mask
    if dim is None:
        return kept.sum() / mask.sum().clamp(min=1.0)
    return kept.sum(dim, keepdim=keepdim) / mask.sum(dim, keepdim=keepdim).clamp(min=1.0)


def log_ratio(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """log pi_new - log pi_sampler per token; 0 where the sampler's is unknown (NaN): the
    current policy stands in for it."""
    old = torch.where(torch.isnan(old_logprobs), new_logprobs.detach(), old_logprobs)
    return new_logprobs - old


def importance_ratio(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    level: Literal["token", "sequence", "average", "geometric_average"] = "token",
) -> torch.Tensor:
    """pi_new / pi_sampler per token, one per sequence broadcast over its tokens, or the
    arithmetic ("average") or geometric mean of the two.

    The sequence ratio is the geometric mean of the token ratios, GSPO's length-normalised
    sequence likelihood ratio (arXiv:2507.18071).
    """
    token = log_ratio(new_logprobs, old_logprobs)
    if level == "token":
        return torch.exp(token)
    sequence = masked_mean(token, mask, dim=-1, keepdim=True).expand_as(new_logprobs)
    if level == "sequence":
        return torch.exp(sequence)
    if level == "average":
        return (torch.exp(token) + torch.exp(sequence)) / 2
    return torch.exp((token + sequence) / 2)


def ppo_loss(
    ratio: torch.Tensor, advantages: torch.Tensor, lower: float, upper: float
) -> torch.Tensor:
    """PPO's clipped surrogate per token, negated to minimise (arXiv:1707.06347)."""
    clipped = ratio.clamp(lower, upper)
    return -torch.minimum(ratio * advantages, clipped * advantages)


def cispo_loss(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    new_logprobs: torch.Tensor,
    lower: float,
    upper: float,
) -> torch.Tensor:
    """CISPO per token: a clipped, non-differentiated importance weight times the
    REINFORCE term, so clipped tokens still get gradient (arXiv:2506.13585)."""
    weight = ratio.clamp(lower, upper).detach()
    return -(weight * advantages * new_logprobs)


def kl_k3(new_logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(new || ref) per token: unbiased and never negative.

    http://joschu.net/blog/kl-approx.html
    """
    log_ratio = ref_logprobs - new_logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


def grpo_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    ref_logprobs: torch.Tensor | None = None,
    sampler_logprobs: torch.Tensor | None = None,
) -> LossResult:
    """The token-level mean loss of one micro-batch, PPO or CISPO as `config.ppo` says.

    ART's optional shapings come first: the ratio capped (`max_ratio`) and zeroed outside
    the clip range (`mask_ratio`); the advantages lowered by tau times the log-ratio to
    the sampler (`kimi_k2_tau`) and shifted by `kl_penalty_coef` times (the mean
    log-ratio to the base model minus the token's own; the policy's log-probabilities, or
    the sampler's with `kl_penalty_source="sample"`). Last, `truncated_is` multiplies
    each token's loss by its importance weight capped at that bound (TIS, Yao et al. 2025):
    `old_logprobs` over `sampler_logprobs` where the old ones are the trainer's own
    (ART's precalculate_logprobs), else the ratio above.
    """
    ratio = importance_ratio(new_logprobs, old_logprobs, mask, config.importance_sampling_level)
    if config.max_ratio is not None:
        ratio = ratio.clamp(max=config.max_ratio)
    if config.mask_ratio:
        inside = (ratio > config.lower) & (ratio < config.upper)
        ratio = torch.where(inside, ratio, torch.zeros_like(ratio))
    if config.kimi_k2_tau:
        advantages = (
            advantages - config.kimi_k2_tau * log_ratio(new_logprobs, old_logprobs).detach()
        )
    kl_policy_ref: torch.Tensor | None = None
    if config.kl_penalty_coef > 0:
        if ref_logprobs is None:
            raise ValueError("grpo_loss: kl_penalty_coef > 0 needs ref_logprobs of the base model")
        policy = new_logprobs
        if config.kl_penalty_source == "sample":  # the sampler's: given apart, or the old ones
            policy = old_logprobs if sampler_logprobs is None else sampler_logprobs
        per_token = (policy - ref_logprobs).detach() * mask
        kl_policy_ref = masked_mean(per_token, mask)
        advantages = advantages + config.kl_penalty_coef * (kl_policy_ref - per_token) * mask
    if config.ppo:
        per_token = ppo_loss(ratio, advantages, config.lower, config.upper)
        # PPO clips only where it removes the gradient: the ratio left the range in the
        # direction the advantage pushes it.
        clipped = ((ratio > config.upper) & (advantages > 0)) | (
            (ratio < config.lower) & (advantages < 0)
        )
    else:
        per_token = cispo_loss(ratio, advantages, new_logprobs, config.lower, config.upper)
        clipped = (ratio > config.upper) | (ratio < config.lower)
    if config.truncated_is is not None:
        weight = (
            ratio
            if sampler_logprobs is None
            else torch.exp(log_ratio(old_logprobs, sampler_logprobs))
        )
        per_token = per_token * weight.clamp(max=config.truncated_is).detach()
    policy_loss = masked_mean(per_token, mask)
    loss = policy_loss
    kl: torch.Tensor | None = None
    if config.beta > 0:
        if ref_logprobs is None:
            raise ValueError("grpo_loss: beta > 0 needs ref_logprobs of the base model")
        kl = masked_mean(kl_k3(new_logprobs, ref_logprobs), mask)
        loss = loss + config.beta * kl
        kl = kl.detach()
    return LossResult(
        loss=loss,
        policy_loss=policy_loss.detach(),
        kl=kl,
        kl_policy_ref=kl_policy_ref,
        clip_fraction=masked_mean(clipped.to(mask.dtype), mask),
        mean_ratio=masked_mean(ratio.detach(), mask),
    )


__all__ = [
    "LossConfig",
    "LossResult",
    "cispo_loss",
    "grpo_loss",
    "importance_ratio",
    "kl_k3",
    "log_ratio",
    "masked_mean",
    "ppo_loss",
]
