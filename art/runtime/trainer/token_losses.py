"""Tinker's built-in losses: per-token functions of the policy's logprobs and a datum's inputs.

A datum is one sequence of `input_ids` with per-token inputs of the same length N, aligned
so that position `i` of the input predicts `target_tokens[i]`. Each loss here returns the
loss at every token; a datum's loss is their SUM (Tinker's convention, where our GRPO loss
takes a token mean), and the gradients of successive `forward_backward` calls add up until
the optimizer step. The formulas are the ones Tinker's documentation states
(tinker-docs.thinkingmachines.ai/tinker/losses, read 2026-11-29); `tests/runtime/trainer/
test_token_losses.py` checks each against a reference computed by hand.

`dro`, `gspo` and `stable_reinforce` (named by the `tinker` SDK 0.38.0) are not served:
asking for them is an error naming them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ...core.data.errors import ConfigError

# Each loss's per-token inputs (beyond the tokens themselves) and its config with defaults.
LOSS_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
}
_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}  # Tinker's fixed 0.2 range
LOSS_CONFIG: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": _CLIP,
    "cispo": _CLIP,
}
NOT_SERVED = ("dro", "gspo", "stable_reinforce")


@dataclass(frozen=True)
class TokenDatum:
    """One sequence to score or train: its input ids and its loss's per-token inputs."""

    input_ids: list[int]
    inputs: Mapping[str, list[float]]  # `target_tokens` too, as whole numbers


def check_loss(name: str, config: Mapping[str, float | str] | None) -> dict[str, float]:
    """The loss's config with its defaults; `ConfigError` naming what is not served."""
    if name in NOT_SERVED:
        raise ConfigError(
            "loss_fn",
            f"{name!r} is not served by art serve",
            f"Use one of {', '.join(LOSS_INPUTS)}, or forward_backward_custom",
        )
    if name not in LOSS_INPUTS:
        raise ConfigError(
            "loss_fn", f"unknown loss {name!r}", f"Use one of {', '.join(LOSS_INPUTS)}"
        )
    resolved = dict(LOSS_CONFIG[name])
    for key, value in (config or {}).items():
        if key not in resolved:
            allowed = ", ".join(resolved) or "none"
            raise ConfigError(
                f"loss_fn_config.{key}", f"{name} takes no {key!r}", f"Its keys: {allowed}"
            )
        if isinstance(value, str | bool):
            raise ConfigError(f"loss_fn_config.{key}", f"{value!r} is not a number", "Give a float")
        resolved[key] = float(value)
    return resolved


def check_datum(datum: TokenDatum, loss: str, index: int) -> None:
    """Refuse a datum whose inputs do not fit `loss`, naming the field."""
    where = f"forward_backward_input.data[{index}]"
    length = len(datum.input_ids)
    if length == 0:
        raise ConfigError(f"{where}.model_input", "has no tokens", "Give at least one token")
    wanted = LOSS_INPUTS[loss]
    for key in wanted:
        if key not in datum.inputs:
            raise ConfigError(
                f"{where}.loss_fn_inputs.{key}",
                f"{loss} needs {key!r}",
                f"Give {', '.join(wanted)}, each of the model input's length",
            )
    for key, values in datum.inputs.items():
        if key not in wanted:
            raise ConfigError(
                f"{where}.loss_fn_inputs.{key}",
                f"{loss} takes no {key!r}",
                f"Give {', '.join(wanted)} only",
            )
        if len(values) != length:
            raise ConfigError(
                f"{where}.loss_fn_inputs.{key}",
                f"has {len(values)} values for {length} input tokens",
                "Give one value per input token (the targets are the input shifted by one)",
            )


def token_loss(
    name: str,
    logprobs: torch.Tensor,
    inputs: Mapping[str, torch.Tensor],
    config: Mapping[str, float],
) -> torch.Tensor:
    """The loss at each token of one datum ([N]); `logprobs` are the policy's of the targets."""
    if name == "cross_entropy":
        return -inputs["weights"] * logprobs
    advantages = inputs["advantages"]
    ratio = torch.exp(logprobs - inputs["logprobs"])
    if name == "importance_sampling":
        return -ratio * advantages
    clipped = torch.clamp(ratio, config["clip_low_threshold"], config["clip_high_threshold"])
    if name == "ppo":
        return -torch.minimum(ratio * advantages, clipped * advantages)
    if name == "cispo":
        return -clipped.detach() * logprobs * advantages
    raise ConfigError("loss_fn", f"unknown loss {name!r}", f"Use one of {', '.join(LOSS_INPUTS)}")


__all__ = [
    "LOSS_CONFIG",
    "LOSS_INPUTS",
    "NOT_SERVED",
    "TokenDatum",
    "check_datum",
    "check_loss",
    "token_loss",
]
