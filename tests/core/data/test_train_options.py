"""ART's `train(...)` keywords of both backends, mapped onto our configs (#50: the keywords
both take are stated once, with their defaults)."""

from __future__ import annotations

from typing import Any

import pytest

from art.core.data.train_options import (
    POLICY_DEFAULTS,
    PolicyKeywords,
    local_train_options,
    serverless_train_options,
)


def test_both_backends_default_to_the_same_policy_and_loss() -> None:
    local, serverless = local_train_options(), serverless_train_options()
    assert local.dev_config == serverless.dev_config
    assert local.config.learning_rate == serverless.config.learning_rate == 5e-6
    assert (local.dev_config.epsilon, local.dev_config.epsilon_high) == (1.0, 4.0)  # CISPO's
    assert set(POLICY_DEFAULTS) == set(PolicyKeywords.__annotations__)


def test_a_shared_keyword_reaches_the_config_the_same_way_from_either_backend() -> None:
    given: dict[str, Any] = {
        "learning_rate": 1e-4,
        "epsilon": 0.1,
        "epsilon_high": 0.3,
        "advantage_balance": 0.5,
        "scale_rewards": False,
        "importance_sampling_level": "sequence",
        "max_negative_advantage_importance_sampling_weight": 2.0,
        "mask_prob_ratio": True,
        "kimi_k2_tau": 0.25,
        "precalculate_logprobs": True,
        "verbose": True,
    }
    assert set(given) == set(POLICY_DEFAULTS)  # every shared keyword, none at its default
    local = local_train_options(loss_fn="ppo", **given)
    serverless = serverless_train_options(ppo=True, **given)
    assert local.dev_config == serverless.dev_config
    assert (local.verbose, serverless.verbose) == (True, True)
    dev = local.dev_config
    assert (dev.ppo, dev.epsilon, dev.epsilon_high, dev.kimi_k2_tau) == (True, 0.1, 0.3, 0.25)
    assert dev.importance_sampling_level == "sequence"
    assert local.config.learning_rate == serverless.config.learning_rate == 1e-4


def test_normalize_advantages_false_turns_off_reward_scaling() -> None:
    assert local_train_options(normalize_advantages=False).dev_config.scale_rewards is False


@pytest.mark.parametrize(
    ("options", "backend", "keyword"),
    [
        (local_train_options, "LocalBackend", "lerning_rate"),
        (serverless_train_options, "ServerlessBackend", "loss_fn"),  # LocalBackend's only
    ],
)
def test_a_keyword_the_backend_does_not_take_is_a_type_error_as_in_art(
    options: Any, backend: str, keyword: str
) -> None:
    with pytest.raises(
        TypeError, match=f"{backend}.train\\(\\) got an unexpected keyword argument '{keyword}'"
    ):
        options(**{keyword: 1})
