"""ART 0.5.18's `backend.train(...)` keywords, mapped onto `TrainConfig` + `dev.TrainConfig`.

Every keyword of ART's `LocalBackend.train` and `ServerlessBackend.train` is either
honoured (mapped below) or refused with a `ConfigError` naming it, before anything is
trained or written. What each keyword does:

- learning_rate: the optimizer's step size (`TrainConfig.learning_rate`).
- loss_fn: "cispo" (CISPO: a clipped, non-differentiated importance weight times the
  log-probability, arXiv:2506.13585) or "ppo" (PPO's clipped surrogate,
  arXiv:1707.06347; `dev.TrainConfig.ppo`); ServerlessBackend spells it `ppo: bool`.
- loss_fn_config, adam_params: must be None, as ART's LocalBackend requires.
- normalize_advantages: False centres each group's rewards without dividing by their
  standard deviation (forces scale_rewards=False), as in ART.
- epsilon, epsilon_high: the importance ratio's clip range [1 - epsilon, 1 + epsilon_high]
  (a larger upper bound is DAPO's clip-higher, arXiv:2503.14476). None takes ART's loss
  defaults: 1.0 and 4.0 for CISPO, 0.2 and epsilon for PPO.
- scale_rewards: divide each group's advantages by its reward standard deviation.
- importance_sampling_level: "token" (a ratio per token), "sequence" (one per sequence,
  GSPO, arXiv:2507.18071), "average" or "geometric_average" (of the two, as ART's).
- max_negative_advantage_importance_sampling_weight: cap the importance ratio (every
  token's, as in ART despite the name).
- mask_prob_ratio: zero the ratio of tokens outside the clip range (no gradient there).
- kimi_k2_tau: lower each token's advantage by tau times its policy/sampler log-ratio.
- kl_penalty_coef: ART's KL-penalised advantage towards the base model
  (`TrainConfig.kl_penalty_coef`; the step reports `kl_policy_ref`).
- kl_penalty_reference_step, kl_ref_adapter_path: the KL reference is one of the model's
  own checkpoints (the backend resolves the step to its directory), or an adapter
  directory, instead of the base model; either needs kl_penalty_coef > 0.
- kl_penalty_source, optimizer_save_interval, final_training_step,
  grad_accumulation_sequences (ART 0.5.23's): `TrainConfig`'s fields of those names.
- allow_training_without_logprobs: also train assistant turns given as plain messages.
- advantage_balance: in [-1, 1]; above 0 negative advantages are multiplied by
  1 - balance, below 0 positive ones by 1 + balance (ART's).
- precalculate_logprobs: the importance ratio is taken against the trainer's own
  logprobs before the step, not the sampler's (ART's).
- truncated_importance_sampling: each token's loss times its importance weight capped at
  this bound (TIS, Yao et al. 2025; trainer/sampler with precalculate_logprobs).
- num_trajectories_learning_rate_multiplier_power: the learning rate times the number of
  trajectories trained to this power (ART counts per packed row; here per step).
- packed_sequence_length: sequences packed into rows (forward passes) of at most this
  many tokens; longer ones are left out of the step with a warning, as in ART.
- logprob_calculation_chunk_size: tokens the LM head takes at a time in the logprob pass.
  None (ART's LocalBackend: 1024) lets the trainer size it: 64 MiB of float32 logits.
- save_checkpoint: False reports `checkpoint_path=None`; as in ART, the step's checkpoint
  is still written (it is what the next rollouts are served from).
- verbose: print what the backend does.

The rest are ART knobs this version has not built; each is refused unless left at its
default (`NOT_BUILT` says what it does in ART and what to use instead).

The mapping functions are pure; every backend's `train` runs the one training step
(`art.core.training.run_step`) with their result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Unpack

from . import dev
from .errors import ConfigError
from .types import TrainConfig


@dataclass(frozen=True)
class NotBuilt:
    """An ART keyword this version refuses unless it is left at `default`."""

    default: Any
    does: str  # what it does in ART, one line
    instead: str = ""  # what to use here instead, if anything


NOT_BUILT: dict[str, NotBuilt] = {
    "plot_tensors": NotBuilt(False, "plots the training tensors for debugging"),
    "scale_learning_rate_by_reward_std_dev": NotBuilt(
        False,
        "is documented to scale the learning rate by the reward standard deviation, but "
        "0.5.18 does nothing with it (its note leaves it to Model.train, which is gone)",
        "no rate follows it in ART either; give the learning_rate you want",
    ),
}


def not_built_error(keyword: str, value: Any, *, prefix: str = "") -> ConfigError | None:
    """The `ConfigError` refusing `keyword=value`, or None when this version honours it."""
    spec = NOT_BUILT.get(keyword)
    if spec is None or _is_default(value, spec.default):
        return None
    fix = f"Leave it at {spec.default!r}"
    return ConfigError(
        prefix + keyword,
        f"{value!r} is not built in this version: in ART it {spec.does}",
        f"{fix}; {spec.instead}" if spec.instead else fix,
    )


def _is_default(value: Any, default: Any) -> bool:
    if default is None or isinstance(default, bool):
        return value is default
    return type(value) in (int, float) and value == default


@dataclass(frozen=True)
class TrainOptions:
    """What one `backend.train(...)` call asks for, in this version's configs.

    `reference_step` is ART's kl_penalty_reference_step, for the backend to resolve to
    that checkpoint's directory (`dev_config.kl_ref_adapter_path`).
    """

    config: TrainConfig
    dev_config: dev.TrainConfig
    reference_step: int | None = None
    report_checkpoint: bool = True
    verbose: bool = False


class PolicyKeywords(TypedDict, total=False):
    """The keywords ART 0.5.18's `LocalBackend.train` and `ServerlessBackend.train` share:
    the step size and the loss's shape. Their defaults are `POLICY_DEFAULTS`, their
    meanings the module docstring's."""

    learning_rate: float
    epsilon: float | None
    epsilon_high: float | None
    advantage_balance: float
    scale_rewards: bool
    importance_sampling_level: Literal["token", "sequence", "average", "geometric_average"]
    max_negative_advantage_importance_sampling_weight: float | None
    mask_prob_ratio: bool
    kimi_k2_tau: float | None
    precalculate_logprobs: bool
    verbose: bool


# ART's defaults for both backends.
POLICY_DEFAULTS: PolicyKeywords = {
    "learning_rate": 5e-6,
    "epsilon": None,
    "epsilon_high": None,
    "advantage_balance": 0.0,
    "scale_rewards": True,
    "importance_sampling_level": "token",
    "max_negative_advantage_importance_sampling_weight": None,
    "mask_prob_ratio": False,
    "kimi_k2_tau": None,
    "precalculate_logprobs": False,
    "verbose": False,
}


class LocalTrainKeywords(PolicyKeywords, total=False):
    """ART 0.5.18's `LocalBackend.train` keywords (`**keywords` of LocalBackend and
    RayBackend); their defaults and meanings are `local_train_options`'s."""

    loss_fn: Literal["cispo", "ppo"]
    loss_fn_config: dict[str, Any] | None
    normalize_advantages: bool
    adam_params: Any
    kl_penalty_coef: float
    kl_penalty_reference_step: int | None
    kl_ref_adapter_path: str | None
    kl_penalty_source: Literal["current_learner", "sample"]
    allow_training_without_logprobs: bool
    plot_tensors: bool
    truncated_importance_sampling: float | None
    scale_learning_rate_by_reward_std_dev: bool
    logprob_calculation_chunk_size: int | None
    packed_sequence_length: int | None
    num_trajectories_learning_rate_multiplier_power: float
    save_checkpoint: bool
    optimizer_save_interval: int
    final_training_step: int | None
    grad_accumulation_sequences: int | None


class ServerlessTrainKeywords(PolicyKeywords, total=False):
    """ART 0.5.18's `ServerlessBackend.train` keywords (its `**keywords`); their defaults
    and meanings are `serverless_train_options`'s."""

    ppo: bool


def _policy(backend: str, given: PolicyKeywords) -> dict[str, Any]:
    """`given` over `POLICY_DEFAULTS`; a TypeError for a keyword neither backend takes, as
    ART's own signature raises it."""
    for keyword in given:
        if keyword not in POLICY_DEFAULTS:
            raise TypeError(f"{backend}.train() got an unexpected keyword argument {keyword!r}")
    return {**POLICY_DEFAULTS, **given}


def local_train_options(
    *,
    loss_fn: Literal["cispo", "ppo"] = "cispo",
    loss_fn_config: dict[str, Any] | None = None,
    normalize_advantages: bool = True,
    adam_params: Any = None,
    kl_penalty_coef: float = 0.0,
    kl_penalty_reference_step: int | None = None,
    kl_ref_adapter_path: str | None = None,
    kl_penalty_source: Literal["current_learner", "sample"] = "current_learner",
    allow_training_without_logprobs: bool = False,
    plot_tensors: bool = False,
    truncated_importance_sampling: float | None = None,
    scale_learning_rate_by_reward_std_dev: bool = False,
    logprob_calculation_chunk_size: int | None = None,
    packed_sequence_length: int | None = None,
    num_trajectories_learning_rate_multiplier_power: float = 0.0,
    save_checkpoint: bool = True,
    optimizer_save_interval: int = 1,
    final_training_step: int | None = None,
    grad_accumulation_sequences: int | None = None,
    **shared: Unpack[PolicyKeywords],
) -> TrainOptions:
    """ART's `LocalBackend.train` keywords as our configs; a `ConfigError` naming any
    keyword refused (see the module docstring for each). The keywords both backends
    take come in `shared` (defaults: `POLICY_DEFAULTS`)."""
    policy = _policy("LocalBackend", shared)
    _check_reference(kl_penalty_coef, kl_penalty_reference_step, kl_ref_adapter_path)
    _refuse(
        {
            "plot_tensors": plot_tensors,
            "scale_learning_rate_by_reward_std_dev": scale_learning_rate_by_reward_std_dev,
        }
    )
    if loss_fn not in ("cispo", "ppo"):
        raise ConfigError(
            "loss_fn",
            f"{loss_fn!r} is not a loss this version (or ART's LocalBackend) trains with",
            "Use 'cispo' (arXiv:2506.13585) or 'ppo' (arXiv:1707.06347)",
        )
    if loss_fn_config is not None:
        raise ConfigError(
            "loss_fn_config",
            "extra loss settings are not taken, as in ART's LocalBackend",
            "Leave it None; the loss is shaped by loss_fn, epsilon and epsilon_high",
        )
    if adam_params is not None:
        raise ConfigError(
            "adam_params",
            "optimizer settings are not taken per call, as in ART's LocalBackend",
            "Leave it None; AdamW's settings belong to the model: _internal_config="
            "art.dev.InternalModelConfig(trainer_args=art.dev.TrainerArgs(adam_beta1=..., "
            "adam_beta2=..., weight_decay=...))",
        )
    _check_bool("normalize_advantages", normalize_advantages)
    _check_bool("save_checkpoint", save_checkpoint)
    if not normalize_advantages:
        policy["scale_rewards"] = False
    return _options(
        policy,
        ppo=loss_fn == "ppo",
        config=TrainConfig(
            learning_rate=policy["learning_rate"],
            kl_penalty_coef=kl_penalty_coef,
            kl_penalty_source=kl_penalty_source,
            optimizer_save_interval=optimizer_save_interval,
            final_training_step=final_training_step,
            grad_accumulation_sequences=grad_accumulation_sequences,
        ),
        allow_training_without_logprobs=allow_training_without_logprobs,
        truncated_importance_sampling=truncated_importance_sampling,
        num_trajectories_learning_rate_multiplier_power=(
            num_trajectories_learning_rate_multiplier_power
        ),
        kl_ref_adapter_path=kl_ref_adapter_path,
        packed_sequence_length=packed_sequence_length,
        logprob_calculation_chunk_size=logprob_calculation_chunk_size,
        reference_step=kl_penalty_reference_step,
        report_checkpoint=save_checkpoint,
    )


def serverless_train_options(
    *, ppo: bool = False, **shared: Unpack[PolicyKeywords]
) -> TrainOptions:
    """ART's `ServerlessBackend.train` keywords as our configs (the shared ones'
    defaults: `POLICY_DEFAULTS`)."""
    policy = _policy("ServerlessBackend", shared)
    _check_bool("ppo", ppo)
    return _options(
        policy,
        ppo=ppo,
        config=TrainConfig(learning_rate=policy["learning_rate"]),
        allow_training_without_logprobs=False,
    )


def _options(
    policy: dict[str, Any],
    *,
    ppo: bool,
    config: TrainConfig,
    reference_step: int | None = None,
    report_checkpoint: bool = True,
    **fields: Any,
) -> TrainOptions:
    """The `TrainOptions` of the shared keywords (`policy`) and a backend's own `fields`
    of `dev.TrainConfig`."""
    _check_bool("verbose", policy["verbose"])
    return TrainOptions(
        config=config,
        dev_config=_dev_config(
            ppo=ppo,
            epsilon=policy["epsilon"],
            epsilon_high=policy["epsilon_high"],
            scale_rewards=policy["scale_rewards"],
            importance_sampling_level=policy["importance_sampling_level"],
            max_negative_advantage_importance_sampling_weight=(
                policy["max_negative_advantage_importance_sampling_weight"]
            ),
            mask_prob_ratio=policy["mask_prob_ratio"],
            kimi_k2_tau=policy["kimi_k2_tau"],
            advantage_balance=policy["advantage_balance"],
            precalculate_logprobs=policy["precalculate_logprobs"],
            **fields,
        ),
        reference_step=reference_step,
        report_checkpoint=report_checkpoint,
        verbose=policy["verbose"],
    )


def _dev_config(
    *, ppo: bool, epsilon: float | None, epsilon_high: float | None, **fields: Any
) -> dev.TrainConfig:
    """`dev.TrainConfig` of `fields`, with ART's loss defaults for an unset clip range."""
    # Each bound on its own: CISPO's weight is clipped only far from 1 (to [0, 5]), PPO's
    # ratio to [0.8, 1.2].
    if epsilon is None:
        epsilon = 0.2 if ppo else 1.0
    if epsilon_high is None and not ppo:
        epsilon_high = 4.0
    return dev.TrainConfig(ppo=ppo, epsilon=epsilon, epsilon_high=epsilon_high, **fields)


def _check_reference(coef: float, step: int | None, adapter_path: str | None) -> None:
    if step is not None and adapter_path is not None:
        raise ConfigError(
            "kl_penalty_reference_step",
            "and kl_ref_adapter_path both name the KL reference",
            "Give one: a step of this model's checkpoints, or an adapter directory",
        )
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ConfigError(
            "kl_penalty_reference_step",
            f"is {step!r}",
            "Give a checkpoint step of this model (an int >= 0; see model.get_step())",
        )
    if (step is not None or adapter_path is not None) and not coef:
        raise ConfigError(
            "kl_penalty_reference_step" if step is not None else "kl_ref_adapter_path",
            "names the KL penalty's reference, but kl_penalty_coef is 0, so none is taken",
            "Set kl_penalty_coef > 0 (e.g. 0.1), or leave the reference unset",
        )


def _refuse(values: Mapping[str, Any]) -> None:
    for keyword, value in values.items():
        error = not_built_error(keyword, value)
        if error is not None:
            raise error


def _check_bool(keyword: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(keyword, f"expected True or False (got {value!r})", "Pass a bool")


__all__ = [
    "NOT_BUILT",
    "POLICY_DEFAULTS",
    "LocalTrainKeywords",
    "NotBuilt",
    "PolicyKeywords",
    "ServerlessTrainKeywords",
    "TrainOptions",
    "local_train_options",
    "not_built_error",
    "serverless_train_options",
]
