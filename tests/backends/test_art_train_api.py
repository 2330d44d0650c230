"""ART 0.5.18's `backend.train(model, groups, **keywords) -> TrainResult` on every backend.

A script written in ART's style runs unchanged on `LocalBackend` with the real default
model; every keyword this version has not built is refused by name before anything is
trained or written; `loss_fn="ppo"` reaches the trainer's loss; and `ServerlessBackend`
trains through a real `art serve`.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
import pytest_asyncio
from helpers import assert_trained_the_groups_told_apart
from openai.types.chat.chat_completion import Choice
from serve_server import KEY, Server

import art
from art.local import LocalBackend
from art.serverless.backend import ServerlessBackend

pytestmark = pytest.mark.model  # loads the default model or starts a model service

REPO = Path(__file__).resolve().parents[2]

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROBE = [{"role": "user", "content": "Write one short sentence about cats."}]
WORDS = ("apple", "river")
EXTRA_WORDS = ("stone", "cloud", "lamp")


@pytest.fixture(scope="module")
def backend(shared_backend: LocalBackend) -> LocalBackend:
    return shared_backend


@pytest.fixture(scope="module")
def art_path(shared_backend: LocalBackend) -> Path:
    return Path(shared_backend.path)


async def gather_groups(
    model: art.TrainableModel,
    max_tokens: tuple[int, int, int] = (6, 6, 6),
    words: tuple[str, ...] = WORDS,
    prompt_per_rollout: bool = False,
) -> list[art.TrajectoryGroup]:
    """A group of three rollouts per word (two by default) through the model's own client,
    the i-th of each group rewarded i and at most `max_tokens[i]` tokens long.

    `prompt_per_rollout`: the i-th rollout asks about `word` and the i-th word of
    `EXTRA_WORDS`, so no two trained sequences of a group can be the same draw."""
    client = model.openai_client()

    async def rollout(word: str, index: int) -> art.Trajectory:
        topic = f"{word} and {EXTRA_WORDS[index]}" if prompt_per_rollout else word
        trajectory = art.Trajectory(
            messages_and_choices=[
                {"role": "user", "content": f"Write a long story about the word {topic}."}
            ]
        )
        completion = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=trajectory.messages(),
            max_tokens=max_tokens[index],
        )
        trajectory.messages_and_choices.append(completion.choices[0])
        trajectory.reward = float(index)
        return trajectory

    return await art.gather_trajectory_groups(
        (art.TrajectoryGroup(rollout(word, i) for i in range(3)) for word in words),
        pbar_desc=None,
    )


async def probe(model: art.TrainableModel, name: str) -> tuple[list[float], int]:
    """The greedy answer's token logprobs under `name`, and its `policy_version`."""
    completion = await model.openai_client().chat.completions.create(
        model=name,
        messages=PROBE,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0,
    )
    extra = completion.choices[0].model_extra or {}
    return [round(value, 4) for value in extra["token_logprobs"]], extra["policy_version"]


def history(model_dir: Path) -> list[dict[str, Any]]:
    lines = (model_dir / "history.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def checkpoint_steps(model_dir: Path) -> list[str]:
    return sorted(p.name for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit())


def expected_loss(groups: list[art.TrajectoryGroup], *, ppo: bool) -> float:
    """The step's loss if the trainer's logprobs were exactly the sampler's (ratio 1).

    PPO's surrogate is then -advantage per token; CISPO's is -advantage * logprob. Both
    are token-level means over the sampled tokens of rollouts with an advantage, with
    GRPO's std-scaled advantages. (The trainer's logprobs differ from the sampler's by
    numerical noise, so a step's loss is only near this.)
    """
    total, tokens = 0.0, 0
    for group in groups:
        rewards = [t.reward for t in group.trajectories]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        for trajectory, reward in zip(group.trajectories, rewards, strict=True):
            if reward == mean:
                continue  # no advantage: not trained
            advantage = (reward - mean) / (std + 1e-6)
            choice = trajectory.messages_and_choices[-1]
            assert isinstance(choice, Choice)
            logprobs: list[float] = (choice.model_extra or {})["token_logprobs"]
            tokens += len(logprobs)
            total += sum(-advantage * (1.0 if ppo else lp) for lp in logprobs)
    return total / tokens


# --- (a) a script in ART 0.5.18's style ------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def script_model(backend: LocalBackend) -> art.TrainableModel:
    model = art.TrainableModel(name="script", project="train-api", base_model=BASE)
    await model.register(backend)
    return model


async def test_an_art_0_5_18_script_trains_one_step_and_logs_it_itself(
    backend: LocalBackend, script_model: art.TrainableModel, art_path: Path
) -> None:
    model = script_model
    before, version_before = await probe(model, model.get_inference_name())
    assert version_before == 0  # the base model (step 0) sampled it

    groups = await gather_groups(model)
    await model.log(groups, split="train")
    result = await backend.train(model, groups, learning_rate=1e-3, loss_fn="cispo")
    await model.log(metrics=result.metrics, step=result.step)

    run = art_path / "train-api" / "models" / "script"
    assert type(result) is art.LocalTrainResult
    assert isinstance(result, art.TrainResult)
    assert result.step == 1 == await model.get_step()
    assert result.checkpoint_path == str(run / "checkpoints" / "0001")
    assert (Path(result.checkpoint_path) / "adapter_model.safetensors").is_file()
    assert math.isfinite(result.metrics["loss/train"])
    assert result.metrics["data/step_num_trajectories"] == 6

    rows = history(run)  # the groups' row, then the metrics row: each once
    assert [row["step"] for row in rows] == [0, 1]
    assert rows[0]["data/step_num_trajectories"] == 6
    assert not any(key.endswith("/loss") or key.startswith("loss/") for key in rows[0])
    assert rows[1]["loss/train"] == result.metrics["loss/train"]  # ART's name, kept as logged
    table = pq.read_table(run / "trajectories" / "train" / "0000.parquet")
    assert table.num_rows == 6  # backend.train logged nothing itself

    after, version_after = await probe(model, model.get_inference_name(1))
    assert version_after == 1
    assert after != before  # the weights served moved


# --- (b) every keyword not built here is refused before anything runs -------------------

REFUSED: list[tuple[str, Any]] = [
    ("loss_fn", "grpo"),
    ("loss_fn_config", {"clip": 0.1}),
    ("adam_params", {"beta1": 0.8}),
    ("kl_penalty_reference_step", 0),
    ("kl_ref_adapter_path", "/tmp/adapter"),
    ("plot_tensors", True),
    ("scale_learning_rate_by_reward_std_dev", True),
]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def untrained(
    backend: LocalBackend,
) -> tuple[art.TrainableModel, list[art.TrajectoryGroup]]:
    model = art.TrainableModel(name="refused", project="train-api", base_model=BASE)
    await model.register(backend)
    return model, await gather_groups(model)


@pytest.mark.parametrize(("keyword", "value"), REFUSED, ids=[f"{k}={v}" for k, v in REFUSED])
async def test_a_keyword_not_built_here_is_refused_by_name_before_anything_is_written(
    backend: LocalBackend,
    untrained: tuple[art.TrainableModel, list[art.TrajectoryGroup]],
    art_path: Path,
    keyword: str,
    value: Any,
) -> None:
    model, groups = untrained
    with pytest.raises(art.ConfigError) as refused:
        await backend.train(model, groups, **{keyword: value})

    assert refused.value.field == keyword
    if keyword.startswith(("kl_", "loss_fn", "adam")):
        assert refused.value.fix  # says what to use instead
    assert await model.get_step() == 0
    run = art_path / "train-api" / "models" / "refused"
    assert checkpoint_steps(run) == ["0000"]
    assert not (run / "history.jsonl").exists()
    assert not (run / "trajectories").exists()


async def test_a_not_built_refusal_says_what_the_knob_does_in_art(
    backend: LocalBackend, untrained: tuple[art.TrainableModel, list[art.TrajectoryGroup]]
) -> None:
    model, groups = untrained
    with pytest.raises(art.ConfigError, match="not built in this version: in ART it") as error:
        await backend.train(model, groups, scale_learning_rate_by_reward_std_dev=True)
    assert "learning_rate" in error.value.fix
    # ART's defaults, given explicitly, are accepted rather than refused.
    with pytest.raises(art.TrajectoryValidationError):  # (only the groups are wrong here)
        await backend.train(model, [], kl_penalty_coef=0.0, plot_tensors=False, kimi_k2_tau=None)


# --- (c) loss_fn="ppo" and save_checkpoint=False -----------------------------------------


async def test_ppo_reaches_the_trainer_and_save_checkpoint_false_reports_no_path(
    backend: LocalBackend, script_model: art.TrainableModel, art_path: Path
) -> None:
    model = script_model
    step = await model.get_step()
    # Rewarding the longer answers (1, 4 and 16 tokens asked for; the reward is the length
    # sampled) puts PPO's loss (-advantage per token) near -0.9 by the lengths alone, and
    # CISPO's (-advantage * logprob per token) above 0, as a longer answer has the lower
    # sequence logprob: the loss says which one ran, whatever was sampled.
    groups = await gather_groups(model, max_tokens=(1, 4, 16))
    for group in groups:
        for trajectory in group.trajectories:
            choice = trajectory.messages_and_choices[-1]
            assert isinstance(choice, Choice)
            trajectory.reward = float(len((choice.model_extra or {})["token_logprobs"]))
    ppo, cispo = expected_loss(groups, ppo=True), expected_loss(groups, ppo=False)
    assert abs(ppo - cispo) > 0.3

    result = await backend.train(
        model, groups, learning_rate=1e-4, loss_fn="ppo", save_checkpoint=False
    )

    assert result.step == step + 1
    loss = result.metrics["loss/train"]
    assert abs(loss - ppo) < abs(loss - cispo) / 2
    assert result.checkpoint_path is None
    # As in ART, the checkpoint is written (and served) all the same.
    run = art_path / "train-api" / "models" / "script"
    assert f"{step + 1:04d}" in checkpoint_steps(run)


async def test_arts_loss_shapings_reach_the_trainer(
    backend: LocalBackend, script_model: art.TrainableModel
) -> None:
    """kl_penalty_coef reports the mean log-ratio to the base model (nonzero on a trained
    adapter, where it is 0 on the untrained one); the other shapings train a step."""
    model = script_model
    assert await model.get_step() >= 1
    result = await backend.train(
        model,
        await gather_groups(model),
        learning_rate=1e-4,
        kl_penalty_coef=0.5,
        importance_sampling_level="geometric_average",
        max_negative_advantage_importance_sampling_weight=3.0,
        mask_prob_ratio=True,
        kimi_k2_tau=0.1,
    )
    assert abs(result.metrics["loss/kl_policy_ref"]) > 1e-4
    assert math.isfinite(result.metrics["loss/train"])
    assert "kl_policy_ref" not in (await backend.train(model, await gather_groups(model))).metrics


# --- (c2) _experimental_fork_checkpoint --------------------------------------------------


@pytest.mark.asyncio(loop_scope="session")
async def test_a_model_forks_another_models_checkpoint_then_trains_on_from_it(
    backend: LocalBackend, art_path: Path
) -> None:
    source = art.TrainableModel(name="fork-source", project="train-api", base_model=BASE)
    await source.register(backend)
    await backend.train(source, await gather_groups(source), learning_rate=1e-3)
    target = art.TrainableModel(name="fork-target", project="train-api", base_model=BASE)
    await target.register(backend)
    unforked = await probe(target, f"{target.get_inference_name()}@0")

    with pytest.raises(art.ConfigError, match="Pick one of its steps: 0, 1") as refused:
        await backend._experimental_fork_checkpoint(target, "fork-source", not_after_step=-1)
    assert refused.value.field == "not_after_step"
    with pytest.raises(FileNotFoundError):
        await backend._experimental_fork_checkpoint(target, "nobody")
    assert await target.get_step() == 0

    await backend._experimental_fork_checkpoint(target, "fork-source", not_after_step=5)
    assert await target.get_step() == 1
    models = art_path / "train-api" / "models"
    adapter = "checkpoints/0001/adapter_model.safetensors"
    assert (models / "fork-target" / adapter).read_bytes() == (
        models / "fork-source" / adapter
    ).read_bytes()
    forked, version = await probe(target, target.get_inference_name())
    assert version == 1
    assert forked == (await probe(source, source.get_inference_name()))[0]
    assert forked != unforked[0]  # the forked adapter is what is served

    result = await backend.train(target, await gather_groups(target), learning_rate=1e-3)
    assert result.step == 2  # trained on from the forked step
    with pytest.raises(art.ConfigError) as refused:
        await backend._experimental_fork_checkpoint(target, "fork-source")
    assert refused.value.field == "model"


# --- (d) ServerlessBackend through a real `art serve` ----------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("serve-train-api") / ".art")
    yield running
    running.stop()


async def test_serverless_backend_train_returns_a_serverless_train_result(server: Server) -> None:
    backend = ServerlessBackend(base_url=server.url, api_key=KEY)
    model = art.TrainableModel(name="remote", project="train-api", base_model=BASE)
    await model.register(backend)
    groups = await gather_groups(model)

    result = await backend.train(model, groups, learning_rate=1e-3, ppo=False)

    assert type(result) is art.ServerlessTrainResult
    assert result.step == 1 == await model.get_step()
    assert result.artifact_name == "local/train-api/remote:step1"
    assert math.isfinite(result.metrics["loss/train"])

    # A bad value is refused by the server, by keyword, before a step starts.
    with pytest.raises(art.ConfigError) as refused:
        await backend.train(model, groups, advantage_balance=1.5)
    assert refused.value.field == "advantage_balance"
    assert await model.get_step() == 1
    # ART's shapings art serve's trainer has: sent, and honoured there.
    shaped = await backend.train(
        model, groups, importance_sampling_level="average", mask_prob_ratio=True, kimi_k2_tau=0.1
    )
    assert shaped.step == 2
    await backend.close()


@pytest.mark.parametrize("where", ["LocalBackend", "ServerlessBackend on art serve"])
def test_the_art_style_example_trains_on_each_backend(
    where: str, server: Server, tmp_path: Path
) -> None:
    """examples/art_style.py, ART 0.5.18's loop as its users write it (delete_checkpoints
    from step 0, log, backend.train with ART's keywords, log the result), two steps."""
    command = [sys.executable, str(REPO / "examples" / "art_style.py"), "--steps", "2"]
    command += ["--path", str(tmp_path)]
    if where != "LocalBackend":
        command += ["--serverless", server.url]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"WANDB_API_KEY": KEY},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 2: loss" in result.stdout
    # Step 0 had no metric to rank by yet: ART's note, and the run went on.
    assert re.search(r'history\.jsonl" not found|No "val/reward" metric found', result.stdout)
    root = tmp_path if where == "LocalBackend" else server.path
    run = root / "art-style" / "models" / "art-style"
    assert_trained_the_groups_told_apart(run)
    # At step 1 the checkpoint of step 0 went: the latest and the best are kept.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["0001", "0002"]


async def test_train_config_grad_accumulation_sequences_bounds_each_pass(
    backend: LocalBackend, art_path: Path
) -> None:
    """ART's `TrainConfig(grad_accumulation_sequences=1)`: one sequence per forward and
    backward pass: a micro-batch per trained sequence, where they were packed before."""
    model = art.TrainableModel(name="accumulate", project="train-api", base_model=BASE)
    await model.register(backend)
    groups = await gather_groups(model)
    await model.train(groups, config=art.TrainConfig(learning_rate=1e-5))
    await model.train(
        groups, config=art.TrainConfig(learning_rate=1e-5, grad_accumulation_sequences=1)
    )
    rows = [
        r for r in history(art_path / "train-api" / "models" / "accumulate") if "loss/train" in r
    ]
    packed, one_each = (r["train/micro_batches"] for r in rows)
    trained = rows[1]["train/sequences_trained"]  # those with a nonzero advantage
    assert packed < trained
    assert one_each == trained

    with pytest.raises(art.ConfigError) as refused:
        await model.train(
            groups,
            config=art.TrainConfig(grad_accumulation_sequences=2),
            _config=art.dev.TrainConfig(gradient_accumulation_sequences=3),
        )
    assert refused.value.field == "config.grad_accumulation_sequences"
    assert await model.get_step() == 2


# --- (e) each option ART's LocalBackend.train takes, against the option off --------------

# Each honoured keyword with a value that changes this step: the groups were sampled one
# step before the checkpoint they train (so the sampler's ratio is not 1 and the clipping
# and importance-sampling knobs act), from the same checkpoint and seed as the step
# without it.
TIGHT = {"epsilon": 0.01, "epsilon_high": 0.01}
OPTION_EFFECTS: list[tuple[dict[str, Any], dict[str, Any]]] = [  # (on, the step it is against)
    # PPO's and CISPO's gradients are the same for a token whose ratio is inside the clip
    # range; they part only outside it, so both take a tight range (at the default one,
    # whether any token of a draw leaves it is the draw's: CI drew none, 2026-11-26).
    ({"loss_fn": "ppo", **TIGHT}, TIGHT),
    ({"normalize_advantages": False}, {}),
    ({"scale_rewards": False}, {}),
    ({"kl_penalty_coef": 0.5}, {}),
    ({"epsilon": 0.01}, {}),
    ({"epsilon_high": 0.01}, {}),
    ({"importance_sampling_level": "sequence"}, {}),
    ({"importance_sampling_level": "average"}, {}),
    ({"importance_sampling_level": "geometric_average"}, {}),
    ({"max_negative_advantage_importance_sampling_weight": 0.5}, {}),
    ({"kimi_k2_tau": 0.5}, {}),
    ({"advantage_balance": 0.5}, {}),  # the worse half of each group pushed down less
    ({"advantage_balance": -0.5}, {}),
    ({"precalculate_logprobs": True}, {}),  # the ratio against the trainer's own: 1
    ({"truncated_importance_sampling": 0.5}, {}),
    (  # with the ratio taken against the trainer's own, the weight is trainer/sampler
        {"truncated_importance_sampling": 0.5, "precalculate_logprobs": True},
        {"precalculate_logprobs": True},
    ),
    ({"num_trajectories_learning_rate_multiplier_power": 0.5}, {}),
    # The forked model's checkpoint 1 is the policy it trains from: the penalty vanishes.
    ({"kl_penalty_coef": 0.5, "kl_penalty_reference_step": 1}, {"kl_penalty_coef": 0.5}),
]
OPTION_EFFECTS += [  # the same reference, given as a directory (the source's step 1)
    (
        {"kl_penalty_coef": 0.5, "kl_ref_adapter_path": "<effects-source step 1>"},
        {"kl_penalty_coef": 0.5},
    ),
    # It masks the tokens whose ratio left the clip range: none do within CISPO's default.
    ({"mask_prob_ratio": True, **TIGHT}, TIGHT),
]
# The rest of ART's keywords are refused by name (NOT_BUILT, tested above), or are
# save_checkpoint, allow_training_without_logprobs, packed_sequence_length and
# logprob_calculation_chunk_size, tested on their own (the last two change the layout of a
# step, not its maths).
# num_trajectories_learning_rate_multiplier_power's rate is checked by
# test_the_learning_rate_follows_the_number_of_trajectories_trained.


async def test_each_training_option_changes_the_step_it_is_given_to(
    backend: LocalBackend, art_path: Path
) -> None:
    from safetensors.torch import load_file

    models = art_path / "train-api" / "models"
    source = art.TrainableModel(name="effects-source", project="train-api", base_model=BASE)
    await source.register(backend)
    # One group, sampled at step 0: each of the ~27 steps below trains on it. Its rollouts
    # have prompts of their own: CI drew the same six tokens for the rollouts rewarded 0
    # and 2 of one prompt (2026-11-29), whose gradients then cancel exactly, and every
    # option that only reweights them changed nothing.
    stale = await gather_groups(source, words=WORDS[:1], prompt_per_rollout=True)
    # Step 1 trains on that group too, so its ratios leave 1 on both sides by what a step
    # does (the rewarded rollout's tokens pushed up, the unrewarded one's down), not by
    # the draw: trained on other groups, a CI draw (2026-12-01) left no token above
    # 1 + 0.01, and the upper clip and the ratio mask acted on nothing.
    await backend.train(source, stale, learning_rate=1e-3)
    count = iter(range(1000))

    async def step_from_the_source(options: dict[str, Any]) -> dict[str, Any]:
        name = f"effects-{next(count)}"
        model = art.TrainableModel(name=name, project="train-api", base_model=BASE)
        await model.register(backend)
        await backend._experimental_fork_checkpoint(model, "effects-source")
        if options.get("kl_ref_adapter_path") == "<effects-source step 1>":
            options = options | {
                "kl_ref_adapter_path": str(models / "effects-source" / "checkpoints" / "0001")
            }
        result = await backend.train(model, stale, learning_rate=1e-3, **options)
        assert result.step == 2
        adapter = load_file(models / name / "checkpoints" / "0002" / "adapter_model.safetensors")
        # Every adapter a service holds makes PEFT's next register and step slower.
        await backend.delete(model)
        return adapter

    def moved(a: dict[str, Any], b: dict[str, Any]) -> float:
        return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)

    off = await step_from_the_source({})
    assert moved(off, await step_from_the_source({})) == 0.0  # the same step, bit for bit
    baselines = {"{}": off}
    unchanged = []
    for on, against in OPTION_EFFECTS:
        if repr(against) not in baselines:
            baselines[repr(against)] = await step_from_the_source(against)
        if moved(baselines[repr(against)], await step_from_the_source(on)) == 0.0:
            unchanged.append(f"{on} against {against}")
    assert not unchanged, f"options that did not change the step: {unchanged}"


async def test_the_learning_rate_follows_the_number_of_trajectories_trained(
    backend: LocalBackend,
) -> None:
    from art.runtime.trainer.advantages import group_advantages

    model = art.TrainableModel(name="rate-power", project="train-api", base_model=BASE)
    await model.register(backend)
    groups = await gather_groups(model)
    trained = sum(  # those with a learning signal; the others are skipped
        advantage != 0.0
        for group in groups
        for advantage in group_advantages([t.reward for t in group.trajectories], scale=True)
    )
    assert trained > 1
    result = await backend.train(
        model, groups, learning_rate=1e-3, num_trajectories_learning_rate_multiplier_power=0.5
    )
    assert result.metrics["loss/learning_rate"] == pytest.approx(1e-3 * trained**0.5)


async def test_arts_packing_keywords_reach_the_trainer(backend: LocalBackend) -> None:
    """packed_sequence_length and logprob_calculation_chunk_size through `backend.train`:
    the trainer's own tests (test_train_memory.py) show their effects on a step; here the
    step reports them: rows kept every sequence, and the plan counts the wider LM-head chunk
    (4 float32 [4096 x vocabulary] tensors instead of [341 x vocabulary], times 1.3)."""
    # A roomy budget of its own, so no micro-batch checkpoints layers to stay within the
    # CPU's default bound (peft_trainer.CPU_MICRO_BATCH_BYTES): the head's chunk alone differs.
    model = art.TrainableModel(
        name="packing",
        project="train-api",
        base_model=BASE,
        _internal_config=art.dev.InternalModelConfig(
            trainer_args=art.dev.TrainerArgs(memory_budget_gb=64.0)
        ),
    )
    await model.register(backend)
    groups = await gather_groups(model)
    default = await backend.train(model, groups, learning_rate=1e-3)
    packed = await backend.train(
        model,
        groups,
        learning_rate=1e-3,
        packed_sequence_length=512,
        logprob_calculation_chunk_size=4096,
    )
    assert packed.metrics["train/sequences_dropped"] == 0
    assert (
        packed.metrics["data/step_loss_bearing_tokens"]
        == default.metrics["data/step_loss_bearing_tokens"]
    )
    # The step's own part of the plan: the service's RSS it starts from moves between steps.
    key = "train/estimated_step_memory_gb"
    grown = packed.metrics[key] - default.metrics[key]
    assert grown == pytest.approx(1.3 * 4 * (4096 - 341) * 49152 * 4 / 1024**3, rel=1e-6)
    with pytest.raises(art.ConfigError) as refused:
        await backend.train(model, groups, logprob_calculation_chunk_size=0)
    assert refused.value.field == "logprob_calculation_chunk_size"
    assert await model.get_step() == 2


async def test_a_kl_reference_checkpoint_is_the_policy_the_penalty_is_taken_against(
    backend: LocalBackend, art_path: Path
) -> None:
    """ART's kl_penalty_reference_step and kl_ref_adapter_path: a step whose reference is
    the checkpoint it trains from measures no divergence (`kl_policy_ref` 0), while the
    base model as reference measures the steps since."""
    model = art.TrainableModel(name="kl-reference", project="train-api", base_model=BASE)
    await model.register(backend)
    groups = await gather_groups(model)
    await backend.train(model, groups, learning_rate=1e-3)
    by_step = await backend.train(
        model, groups, learning_rate=1e-3, kl_penalty_coef=0.5, kl_penalty_reference_step=1
    )
    assert abs(by_step.metrics["loss/kl_policy_ref"]) < 1e-6
    by_path = await backend.train(
        model,
        groups,
        learning_rate=1e-3,
        kl_penalty_coef=0.5,
        kl_ref_adapter_path=str(art_path / "train-api/models/kl-reference/checkpoints/0002"),
    )
    assert abs(by_path.metrics["loss/kl_policy_ref"]) < 1e-6
    base = await backend.train(model, groups, learning_rate=1e-3, kl_penalty_coef=0.5)
    assert abs(base.metrics["loss/kl_policy_ref"]) > 1e-3  # the mean log-ratio to the base

    for keywords, field in [
        ({"kl_penalty_coef": 0.5, "kl_penalty_reference_step": 99}, "kl_penalty_reference_step"),
        ({"kl_penalty_reference_step": 1}, "kl_penalty_reference_step"),  # no penalty taken
        ({"kl_penalty_coef": 0.5, "kl_ref_adapter_path": str(art_path)}, "kl_ref_adapter_path"),
    ]:
        with pytest.raises(art.ConfigError) as refused:
            await backend.train(model, groups, **keywords)
        assert refused.value.field == field
    assert await model.get_step() == 4


async def test_a_model_forks_another_models_checkpoint_through_art_serve(
    server: Server, s3_bucket: str
) -> None:
    backend = ServerlessBackend(base_url=server.url, api_key=KEY)
    source = art.TrainableModel(name="fork-from", project="train-api", base_model=BASE)
    await source.register(backend)
    await backend.train(source, await gather_groups(source), learning_rate=1e-3)
    target = art.TrainableModel(name="fork-into", project="train-api", base_model=BASE)
    await target.register(backend)

    await backend._experimental_fork_checkpoint(target, "fork-from", not_after_step=5)
    assert await target.get_step() == 1
    models = server.path / "train-api" / "models"
    adapter = "checkpoints/0001/adapter_model.safetensors"
    assert (models / "fork-into" / adapter).read_bytes() == (
        models / "fork-from" / adapter
    ).read_bytes()
    # What is served now is the forked adapter: the same greedy answer as the source's.
    assert (await probe(target, target.get_inference_name(1)))[0] == (
        await probe(source, source.get_inference_name(1))
    )[0]
    result = await backend.train(target, await gather_groups(target), learning_rate=1e-3)
    assert result.step == 2  # trained on from the forked step

    with pytest.raises(art.ConfigError) as refused:
        await backend._experimental_fork_checkpoint(target, "fork-from")
    assert refused.value.field == "model"

    # From S3: pulled by the client (its AWS settings), uploaded to the server zipped.
    from art.utils.s3 import push_model_to_s3

    await push_model_to_s3("fork-from", "train-api", s3_bucket, "runs", art_path=str(server.path))
    from_s3 = art.TrainableModel(name="fork-s3", project="train-api", base_model=BASE)
    await from_s3.register(backend)
    with pytest.raises(art.ConfigError) as refused:
        await backend._experimental_fork_checkpoint(from_s3, "fork-from", prefix="runs")
    assert refused.value.field == "prefix"
    await backend._experimental_fork_checkpoint(
        from_s3, "fork-from", from_s3_bucket=s3_bucket, prefix="runs"
    )
    assert await from_s3.get_step() == 1
    assert (models / "fork-s3" / adapter).read_bytes() == (
        models / "fork-from" / adapter
    ).read_bytes()
    assert (await probe(from_s3, from_s3.get_inference_name(1)))[0] == (
        await probe(source, source.get_inference_name(1))
    )[0]
    await backend.close()

    # The upload route checks what it is sent, and names what is wrong.
    def zipped(files: dict[str, str]) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for name, text in files.items():
                archive.writestr(name, text)
        return buffer.getvalue()

    config = json.dumps({"base_model_name_or_path": BASE})
    url = f"{server.url}/preview/models/train-api~fork-s3/checkpoints"
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}) as http:
        for step, body, status, param, words in (
            (5, b"not a zip", 400, "body", "not a zip archive"),
            (5, zipped({"../adapter_config.json": config}), 400, "body", "not a relative path"),
            (5, zipped({".hidden": "x", "adapter_config.json": config}), 400, "body", "hidden"),
            (5, zipped({"weights.bin": "x"}), 400, "body", "no adapter_config.json"),
            (5, zipped({"adapter_config.json": '{"base_model_name_or_path": "x/y"}'}), 400,
             "body", "trained on 'x/y'"),
            (1, zipped({"adapter_config.json": config}), 409, "step", "at step 1 already"),
            (0, zipped({"adapter_config.json": config}), 400, "step", "1 or more"),
        ):  # fmt: skip
            answer = await http.put(f"{url}/{step}", content=body)
            assert answer.status_code == status, answer.text
            assert answer.json()["error"]["param"] == param
            assert words in answer.json()["error"]["message"]
    assert await from_s3.get_step() == 1
