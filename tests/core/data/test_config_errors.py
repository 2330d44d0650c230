"""Bad config values and keys raise `ConfigError`s naming the field and the fix, never pydantic's dump.

ART's `art.dev` configs are open dicts; the keys ART users pass there that this version
does not have get a message saying what to use instead.
"""

from __future__ import annotations

import inspect

import pytest
from helpers import sampled_choice
from pydantic import ValidationError

import art
from art.core.data import errors


def _raises(call: object, field: str, *fragments: str) -> art.ConfigError:
    assert callable(call)
    with pytest.raises(art.ConfigError) as raised:
        call()
    error = raised.value
    assert error.field == field
    assert not isinstance(error, ValidationError)
    message = str(error)
    assert "pydantic" not in message  # no link to pydantic's error pages, no dump
    for fragment in fragments:
        assert fragment in message, message
    return error


def test_bad_train_config_values_name_the_field() -> None:
    _raises(lambda: art.TrainConfig(learning_rate=-1), "learning_rate", "greater than 0", "-1")
    _raises(lambda: art.TrainConfig(learning_rat=1e-5), "learning_rat", "learning_rate, beta")
    _raises(lambda: art.dev.TrainConfig(epsilon=0), "epsilon", "Lower clip range")


def test_bad_model_values_name_the_field_at_construction_and_assignment() -> None:
    _raises(lambda: art.Model(name="bad name", project="p"), "name", "not a valid name")
    _raises(
        lambda: art.TrainableModel(name="m", project="p", base_model=" "),
        "base_model",
        "base_model is empty",
    )
    model = art.Model(name="ok", project="p")
    with pytest.raises(art.ConfigError) as raised:
        model.project = "a/b"
    assert raised.value.field == "project"
    assert model.project == "p"


def test_keys_of_arts_own_config_dicts_say_what_to_use_here() -> None:
    _raises(lambda: art.dev.InitArgs(fast_inference=True), "fast_inference", "engine='vllm'")
    _raises(lambda: art.dev.EngineArgs(tensor_parallel_size=2), "tensor_parallel_size", "vLLM")
    _raises(
        lambda: art.dev.TrainerArgs(learning_rate=1e-5),
        "learning_rate",
        "art.TrainConfig(learning_rate=...)",
    )
    _raises(
        lambda: art.dev.InternalModelConfig(init_args={"gpu_memory_utilization": 0.8}),  # type: ignore[arg-type]
        "init_args.gpu_memory_utilization",
        "EngineArgs(gpu_memory_utilization=...)",
    )
    # ART 0.5.18's InternalModelConfig keys with nothing to set here say why.
    _raises(
        lambda: art.dev.InternalModelConfig(allow_unvalidated_arch=True),  # type: ignore[call-arg]
        "allow_unvalidated_arch",
        "no supported-architecture registry",
    )
    _raises(
        lambda: art.dev.InternalModelConfig(tinker_native_args={}),  # type: ignore[call-arg]
        "tinker_native_args",
        "Tinker backend is not part of this version",
    )
    # A key ART does not have either: the settings there are are listed.
    _raises(lambda: art.dev.PeftArgs(rank=8), "rank", "r, lora_alpha")


def test_arts_dict_form_of_internal_model_config_is_accepted() -> None:
    model = art.TrainableModel(
        name="m",
        project="p",
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
        _internal_config={"engine_args": {"max_num_seqs": 8}},
    )
    assert model.internal_config.engine_args.max_num_seqs == 8
    _raises(
        lambda: art.TrainableModel(
            name="m", project="p", base_model="x", _internal_config={"init_args": {"bad": 1}}
        ),
        "init_args.bad",
        "max_seq_length",
    )


def test_the_error_tree_names_every_error_art_defines() -> None:
    from art.autorl.inputs import InputGenerationError
    from art.integrations.mcp.generate import ScenarioGenerationError
    from art.integrations.mcp.session import MCPConnectionError

    tree = inspect.getdoc(errors) or ""
    defined = [
        *(c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, Exception)),
        InputGenerationError,
        ScenarioGenerationError,
        MCPConnectionError,
    ]
    for cls in defined:
        assert issubclass(cls, art.ArtError)
        assert cls.__name__ in tree, cls.__name__


async def test_gather_shows_at_most_max_metrics_of_the_trajectories_metrics(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def rollout() -> art.Trajectory:
        trajectory = art.Trajectory(
            messages_and_choices=[{"role": "user", "content": "q"}, sampled_choice("a b")],
            reward=1.0,
        )
        trajectory.metrics.update({"first_metric": 2.0, "second_metric": 3.0})
        return trajectory

    await art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout() for _ in range(2))], pbar_desc="g1", max_metrics=1
    )
    shown = capsys.readouterr().err
    assert "first_metric=2" in shown
    assert "second_metric" not in shown
    await art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout() for _ in range(2))], pbar_desc="g2"
    )
    shown = capsys.readouterr().err
    assert "first_metric=2" in shown
    assert "second_metric=3" in shown
    with pytest.raises(art.ConfigError, match="max_metrics"):
        await art.gather_trajectory_groups([], max_metrics=-1)


def test_a_model_json_from_before_trainer_backend_still_registers() -> None:
    from art.core.data.registration import refuse_changed_registration

    config = art.dev.InternalModelConfig().model_dump(mode="json")
    stored = {k: v for k, v in config.items() if k != "trainer_backend"} | {"trainer": None}
    record = {"name": "m", "base_model": "b", "internal_config": config}
    refuse_changed_registration(
        {"name": "m", "base_model": "b", "internal_config": stored}, record, where="here"
    )
