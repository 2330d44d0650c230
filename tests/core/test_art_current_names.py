"""ART 0.5.23's names on models and configs, beside 0.5.18's: each honoured or refused by name.

No model is loaded here: the configs are checked where they are read, the loss on
hand-worked tensors, the tokenizer's assistant turns on the default model's tokenizer,
LiteLLM's parameters against a real HTTP server on 127.0.0.1. The steps these settings
change are in tests/backends/test_art_current_names_training.py.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import typing
from pathlib import Path
from typing import Any

import pytest

import art
from art.core.data.errors import BackendError, ConfigError, ModelNotRegisteredError

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


def trainable(**fields: Any) -> art.TrainableModel:
    return art.TrainableModel(name="agent", project="names", base_model=BASE, **fields)


# --- TrainableModel(run_name=..., lora_config=...) ------------------------------------


def test_run_name_defaults_to_name_is_the_storage_name_and_a_bad_one_is_refused() -> None:
    assert trainable().run_name == trainable().storage_name == "agent"
    run = trainable(run_name="agent-run-2")
    assert (run.name, run.run_name, run.storage_name) == ("agent", "agent-run-2", "agent-run-2")
    assert run._storage_name() == "agent-run-2", "ART 0.5.23's spelling"
    assert art.TrainableModel.model_validate(run.model_dump()).storage_name == "agent-run-2"
    assert art.Model(name="gpt", project="names").storage_name == "gpt"
    from art.utils.output_dirs import get_model_dir

    assert get_model_dir(run, "/x").endswith("/names/models/agent-run-2")
    with pytest.raises(ConfigError) as raised:
        trainable(run_name="../elsewhere")
    assert raised.value.field == "run_name"


def test_lora_config_sets_the_adapter_the_trainer_builds() -> None:
    from art.runtime.trainer.peft_trainer import lora_config

    model = trainable(
        lora_config=art.LoRAConfig(
            rank=4,
            alpha=8,
            dropout=0.05,
            target_modules=["q_proj", "v_proj"],
            max_seq_length=2048,
            random_state=7,
            use_gradient_checkpointing="unsloth",
            bias="none",
            use_rslora=False,
        )
    )
    config = model.internal_config
    peft = lora_config(config.peft_args)  # PEFT's config, as the trainer makes the adapter
    assert (peft.r, peft.lora_alpha, peft.lora_dropout) == (4, 8, 0.05)
    assert sorted(peft.target_modules or []) == ["q_proj", "v_proj"]
    assert config.init_args.max_seq_length == 2048
    assert config.trainer_args.seed == 7
    assert config.trainer_args.gradient_checkpointing is True
    # What a backend of ART's protocol is sent, and a model rebuilt from it, keep it.
    dumped = model.model_dump()
    assert dumped["lora_config"]["rank"] == 4
    assert dumped["_internal_config"]["peft_args"]["r"] == 4
    assert art.TrainableModel.model_validate(dumped).internal_config.peft_args.r == 4
    # ART 0.5.23's client sends lora_config beside an _internal_config without it.
    sent = dumped | {"_internal_config": None, "lora_config": {"rank": 2}}
    assert art.TrainableModel.model_validate(sent).internal_config.peft_args.r == 2


@pytest.mark.parametrize(
    ("lora", "field"),
    [
        ({"use_rslora": True}, "lora_config['use_rslora']"),
        ({"bias": "all"}, "lora_config['bias']"),
        ({"modules_to_save": ["lm_head"]}, "lora_config['modules_to_save']"),
        ({"layers_to_transform": [0, 1]}, "lora_config['layers_to_transform']"),
        ({"init_weights": False}, "lora_config['init_weights']"),
        ({"loftq_config": {"loftq_bits": 4}}, "lora_config['loftq_config']"),
        ({"temporary_location": "/tmp/x"}, "lora_config['temporary_location']"),
        ({"use_gradient_checkpointing": "sometimes"}, "lora_config['use_gradient_checkpointing']"),
        ({"r": 4}, "lora_config['r']"),
        ({"rank": 0}, "lora_config (peft_args.r)"),
        ({"rank": "four"}, "lora_config (peft_args.r)"),
    ],
)
def test_lora_config_values_not_built_here_are_refused_by_name(
    lora: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        trainable(lora_config=lora)
    assert raised.value.field == field


def test_lora_config_and_internal_config_may_agree_but_not_differ() -> None:
    same = art.dev.InternalModelConfig(peft_args=art.dev.PeftArgs(r=4))
    assert (
        trainable(lora_config={"rank": 4}, _internal_config=same).internal_config.peft_args.r == 4
    )
    other = art.dev.InternalModelConfig(peft_args=art.dev.PeftArgs(r=16))
    with pytest.raises(ConfigError, match=r"peft_args\.r is 16") as raised:
        trainable(lora_config={"rank": 4}, _internal_config=other)
    assert raised.value.field == "lora_config['rank']"


def test_rollout_weight_update_mode_step_lora_is_ours_in_flight_is_refused() -> None:
    assert typing.get_args(art.dev.RolloutWeightUpdateMode) == ("step_lora", "in_flight_lora")
    assert art.dev.InternalModelConfig(rollout_weight_update_mode="step_lora")
    assert art.dev.InternalModelConfig(rollout_weights_mode="lora")  # ART 0.5.18's key
    with pytest.raises(ConfigError) as raised:
        art.dev.InternalModelConfig(rollout_weight_update_mode="in_flight_lora")
    assert raised.value.field == "rollout_weight_update_mode"
    assert "step_lora" in str(raised.value)


# --- TrainConfig / TrainSFTConfig --------------------------------------------------------


def test_optimizer_state_is_kept_at_ARTs_steps() -> None:
    every = art.TrainConfig()
    assert [every.keeps_optimizer_state(step) for step in range(1, 5)] == [True] * 4
    art_default = art.TrainConfig(optimizer_save_interval=5, final_training_step=12)
    kept = [step for step in range(1, 15) if art_default.keeps_optimizer_state(step)]
    assert kept == [1, 5, 10, 12, 13, 14]
    with pytest.raises(ConfigError) as raised:
        art.TrainConfig(optimizer_save_interval=0)
    assert raised.value.field == "optimizer_save_interval"


def test_kl_penalty_source_picks_whose_logprobs_meet_the_reference() -> None:
    import torch

    from art.runtime.trainer.loss import LossConfig, grpo_loss

    mask = torch.ones(1, 3)
    new = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    sampled = torch.tensor([[-1.5, -2.5, -2.0]])
    ref = torch.tensor([[-1.0, -1.0, -1.0]])
    advantages = torch.ones(1, 3)

    def kl(source: str) -> float:
        config = LossConfig(kl_penalty_coef=0.5, kl_penalty_source=source)  # type: ignore[arg-type]
        result = grpo_loss(new, sampled, advantages, mask, config, ref)
        assert result.kl_policy_ref is not None
        return float(result.kl_policy_ref)

    assert kl("current_learner") == pytest.approx((0 - 1 - 2) / 3)  # new - ref
    assert kl("sample") == pytest.approx((-0.5 - 1.5 - 1.0) / 3)  # sampled - ref
    # Through art.TrainConfig, as the trainer builds it.
    config = art.TrainConfig(kl_penalty_coef=0.5, kl_penalty_source="sample")
    assert LossConfig.from_configs(config, art.dev.TrainConfig()).kl_penalty_source == "sample"


def test_backend_train_takes_ARTs_0_5_23_checkpoint_and_kl_keywords() -> None:
    from art.core.data.train_options import local_train_options

    options = local_train_options(
        kl_penalty_coef=0.1,
        kl_penalty_source="sample",
        optimizer_save_interval=5,
        final_training_step=20,
        grad_accumulation_sequences=4,
    )
    assert options.config.kl_penalty_source == "sample"
    assert (options.config.optimizer_save_interval, options.config.final_training_step) == (5, 20)
    assert options.config.grad_accumulation_sequences == 4


def test_serverless_sends_the_new_fields_and_art_serve_reads_them_back() -> None:
    from art.backends.serverless import experimental_config
    from art.serve.schemas import ExperimentalTrainingConfig

    config = art.TrainConfig(
        kl_penalty_coef=0.1,
        kl_penalty_source="sample",
        optimizer_save_interval=3,
        final_training_step=9,
    )
    sent = experimental_config(config, art.dev.TrainConfig())
    received, _ = ExperimentalTrainingConfig(**sent).to_configs()
    assert received.kl_penalty_source == "sample"
    assert (received.optimizer_save_interval, received.final_training_step) == (3, 9)


def test_assistant_turns_reaches_the_trainers_config_once() -> None:
    from art.core.training import _with_assistant_turns

    last = art.TrainSFTConfig(assistant_turns="last")
    assert _with_assistant_turns(last, art.dev.TrainSFTConfig()).assistant_turns == "last"
    assert (
        "assistant_turns"
        not in _with_assistant_turns(
            art.TrainSFTConfig(), art.dev.TrainSFTConfig()
        ).model_fields_set
    )  # the default sends nothing new to a backend of ART's protocol
    with pytest.raises(ConfigError) as raised:
        _with_assistant_turns(last, art.dev.TrainSFTConfig(assistant_turns="all"))
    assert raised.value.field == "config.assistant_turns"


def test_assistant_turns_last_trains_only_the_final_assistant_message() -> None:
    from art.core.data.errors import TrainingError
    from art.runtime.tokenizer import get_tokenizer
    from art.runtime.trainer.tokenize import tokenize_trajectory

    tokenizer = get_tokenizer(BASE)
    messages: list[Any] = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Red."},
        {"role": "user", "content": "Another."},
        {"role": "assistant", "content": "Blue."},
    ]
    trajectory = art.Trajectory(messages_and_choices=messages)

    def trained_text(last: bool) -> str:
        (sequence,) = tokenize_trajectory(
            trajectory,
            tokenizer,
            group_index=0,
            trajectory_index=0,
            allow_training_without_logprobs=True,
            last_turn_only=last,
        )
        ids = [t for t, on in zip(sequence.token_ids, sequence.trained, strict=True) if on]
        return str(tokenizer.decode(ids))

    assert "Red." in trained_text(False)
    assert "Blue." in trained_text(False)
    assert "Blue." in trained_text(True)
    assert "Red." not in trained_text(True)
    ends_with_user = art.Trajectory(messages_and_choices=messages[:3])
    with pytest.raises(TrainingError, match=r"assistant_turns='last'.*'user' message"):
        tokenize_trajectory(
            ends_with_user,
            tokenizer,
            group_index=0,
            trajectory_index=0,
            allow_training_without_logprobs=True,
            last_turn_only=True,
        )


# --- art.get_tokenizer, art.errors ------------------------------------------------------


def test_get_tokenizer_is_the_models_own_and_a_revision_of_a_local_model_is_refused() -> None:
    import art.tokenizer

    assert art.tokenizer.get_tokenizer is art.get_tokenizer
    tokenizer = art.get_tokenizer(BASE)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "<|im_start|>user\nhi<|im_end|>" in text
    with pytest.raises(ConfigError) as raised:
        art.get_tokenizer(BASE, revision="main")
    assert raised.value.field == "revision"


def test_art_errors_names_are_ours_where_the_meaning_matches() -> None:
    import art.errors
    from art.core.store.s3 import ForbiddenBucketCreationError, S3Error

    assert art.errors.ARTError is art.ArtError
    assert art.LocalServingUnavailableError is art.errors.LocalServingUnavailableError
    error = art.errors.LocalServingUnavailableError("the endpoint went away")
    assert isinstance(error, RuntimeError)
    assert isinstance(error, BackendError)
    assert isinstance(art.errors.ArtVllmMetricsTimeoutError("slow"), TimeoutError)
    assert art.errors.ForbiddenBucketCreationError is ForbiddenBucketCreationError
    forbidden = ForbiddenBucketCreationError("no", bucket="b", key=None, code="403")
    assert isinstance(forbidden, art.errors.ARTError)
    assert isinstance(forbidden, S3Error)
    timed_out = art.errors.LoRADeploymentTimedOutError("took too long")
    assert (timed_out.status_code, timed_out.detail) == (504, "took too long")
    assert art.errors.UnsupportedLoRADeploymentProviderError("x").status_code == 400
    assert art.errors.UnsupportedBaseModelDeploymentError("x").status_code == 400
    rebuilt = pickle.loads(pickle.dumps(error))
    assert type(rebuilt) is type(error)
    assert str(rebuilt) == str(error)


# --- Model(base_path=...), log without a backend, update_wandb_config, LiteLLM ---------------


def test_a_model_with_no_backend_logs_under_its_base_path(tmp_path: Path) -> None:
    model = art.Model(name="gpt-judge", project="names", base_path=str(tmp_path / "logs"))
    group = art.TrajectoryGroup(
        art.Trajectory(
            messages_and_choices=[
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": f"a{i}"},
            ],
            reward=float(i),
        )
        for i in range(2)
    )
    asyncio.run(model.log([group], split="val"))
    model_dir = tmp_path / "logs" / "names" / "models" / "gpt-judge"
    (row,) = [json.loads(line) for line in (model_dir / "history.jsonl").read_text().splitlines()]
    assert row["step"] == 0
    assert row["val/reward"] == pytest.approx(0.5)
    assert (model_dir / "trajectories" / "val" / "0000.parquet").is_file()

    unregistered = trainable(base_path=str(tmp_path / "logs"))
    asyncio.run(unregistered.log(metrics={"score": 1.0}, step=3))  # a step given: written
    history = (tmp_path / "logs" / "names" / "models" / "agent" / "history.jsonl").read_text()
    assert json.loads(history)["val/score"] == 1.0
    with pytest.raises(ModelNotRegisteredError):  # no step, and none to ask a backend for
        asyncio.run(unregistered.log(metrics={"score": 1.0}))


def test_update_wandb_config_merges_and_refuses_a_changed_value() -> None:
    model = art.Model(name="m", project="names", report_metrics=[])
    model.update_wandb_config({"lr": 1e-5, "data": {"name": "gsm8k"}})
    model.update_wandb_config({"data": {"split": "train"}, "lr": 1e-5})
    assert model._wandb_config == {"lr": 1e-5, "data": {"name": "gsm8k", "split": "train"}}
    with pytest.raises(ConfigError) as raised:
        model.update_wandb_config({"data": {"name": "math"}})
    assert raised.value.field == "config['data']['name']"
    with pytest.raises(ConfigError):
        model.update_wandb_config({"f": object()})


def test_litellm_params_reach_a_trainable_models_endpoint_as_hosted_vllm(
    scripted_chat: Any,
) -> None:
    import litellm

    model = trainable()
    model.inference_base_url = scripted_chat.url
    model.inference_api_key = "key"
    params = model.litellm_completion_params(step=2)
    assert params["model"] == "hosted_vllm/agent@2"
    assert params["temperature"] == 1.0
    scripted_chat.answers.append("hello")
    messages = [{"role": "user", "content": "hi"}]
    response = asyncio.run(litellm.acompletion(messages=messages, **params))
    assert response.choices[0].message.content == "hello"
    (request,) = scripted_chat.requests
    assert request["model"] == "agent@2"  # LiteLLM sends the served name as it is
    assert request["temperature"] == 1.0


# --- art.utils.sft ----------------------------------------------------------------------


def write_jsonl(path: Path, count: int) -> Path:
    lines = [
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": f"q{i}"},
                    {"role": "assistant", "content": f"a{i}"},
                ]
            }
        )
        for i in range(count)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_iterate_file_yields_trajectories_in_an_order_its_seed_fixes(tmp_path: Path) -> None:
    from art.utils.sft import iterate_file

    path = str(write_jsonl(tmp_path / "data.jsonl", 12))

    def answers(**options: Any) -> list[str]:
        out = []
        for trajectory in iterate_file(path, shuffle_buffer_size=4, **options):
            assert isinstance(trajectory, art.Trajectory)
            out.append(str(trajectory.messages()[-1]["content"]))
        return out

    first = answers(seed=1)
    assert sorted(first) == sorted(f"a{i}" for i in range(12))
    assert answers(seed=1) == first
    assert answers(seed=2) != first
    assert answers(seed=1, initial_skip=5) == first[5:]
    assert answers(seed=1, epochs=2)[:12] == first


def test_arts_small_sft_helpers(tmp_path: Path) -> None:
    from art.utils.sft import get_file_row_count, resolve_sft_batch_size

    path = write_jsonl(tmp_path / "data.jsonl", 5)
    path.write_text(path.read_text() + "\n  \n")  # blank lines are not rows
    assert get_file_row_count(str(path)) == 5
    assert resolve_sft_batch_size(batch_size="auto", default_batch_size=4) == 4
    assert resolve_sft_batch_size(batch_size=3, default_batch_size=4) == 3


def test_create_sft_dataset_iterator_cuts_one_schedule_into_chunks() -> None:
    from art.core.data.sft_data import create_lr_schedule
    from art.utils.sft import SFTChunk, create_sft_dataset_iterator

    items = [
        art.Trajectory(messages_and_choices=[{"role": "assistant", "content": str(i)}])
        for i in range(7)
    ]
    chunks = list(
        create_sft_dataset_iterator(
            items, chunk_size=2, epochs=2, batch_size=2, peak_lr=1e-3, show_progress=False
        )
    )
    # 7 trajectories are 4 batches an epoch, 8 in all; chunks of 2 batches (4 trajectories).
    assert [(c.epoch, c.step, c.epoch_step, len(c.trajectories)) for c in chunks] == [
        (0, 0, 0, 4),
        (0, 2, 2, 3),
        (1, 4, 0, 4),
        (1, 6, 2, 3),
    ]
    assert all(isinstance(c, SFTChunk) for c in chunks)
    schedule = create_lr_schedule(8, 1e-3, "linear", int(8 * 0.1))
    assert [rate for c in chunks for rate in c.config.learning_rate] == schedule  # type: ignore[union-attr]
    assert {c.config.batch_size for c in chunks} == {2}
    epoch = [t for c in chunks[:2] for t in c.trajectories]
    assert sorted(id(t) for t in epoch) == sorted(id(t) for t in items)
    again = create_sft_dataset_iterator(items, chunk_size=2, batch_size=2, show_progress=False)
    assert [t for c in again for t in c.trajectories] == epoch  # seed 42, epoch 0: same order
    resumed = list(
        create_sft_dataset_iterator(
            items, chunk_size=2, epochs=2, batch_size=2, initial_step=5, show_progress=False
        )
    )
    assert [c.step for c in resumed] == [4, 6]  # from the chunk holding batch 5
    with pytest.raises(art.ArtValueError) as raised:
        list(create_sft_dataset_iterator(items, chunk_size=0))
    assert raised.value.field == "chunk_size"
