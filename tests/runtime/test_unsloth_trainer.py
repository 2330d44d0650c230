"""The Unsloth trainer for real: Unsloth's CPU backend from `.venv-unsloth`, on the default model.

One LocalBackend (in this process, so a test can reach the trainer's child process) trains
a model with `trainer_backend='unsloth'`, in float32 on both sides; the service's
transformers engine serves its checkpoints. The checkpoints are scored apart, as plain
PEFT adapters on a copy of the default model. `make test` builds `.venv-unsloth`; without
it (pytest run by hand) the module is skipped with the reason printed.
"""

from __future__ import annotations

import copy
import json
import math
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from helpers import one_at_a_time
from openai.types.chat.chat_completion import Choice

import art
from art.core.store.model_store import ModelStore
from art.local import LocalBackend
from art.runtime.trainer.unsloth_trainer import INSTALL_HINT, find_unsloth_python

pytestmark = pytest.mark.model  # loads the default model or starts a model service

if find_unsloth_python() is None:
    pytest.skip(f"no Unsloth environment: {INSTALL_HINT}", allow_module_level=True)

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
CONFIG = art.dev.InternalModelConfig(
    trainer_backend="unsloth", init_args=art.dev.InitArgs(dtype="float32", max_seq_length=512)
)
PROMPT = [{"role": "user", "content": "Name a colour."}]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalBackend]:
    backend = LocalBackend(path=tmp_path_factory.mktemp("unsloth") / ".art", in_process=True)
    yield backend
    await backend.close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def model(backend: LocalBackend) -> art.TrainableModel:
    model = art.TrainableModel(
        name="agent", project="unsloth", base_model=BASE, _internal_config=CONFIG
    )
    await model.register(backend)
    return model


def model_dir(backend: LocalBackend, model: art.TrainableModel) -> Path:
    return ModelStore(backend.path, model.project, model.name).dir


def trainer_of(backend: LocalBackend, model: art.TrainableModel) -> Any:
    service: Any = backend.service  # in-process: the ModelService itself
    return service._models[f"{model.project}/{model.name}"].trainer


async def sample(model: art.TrainableModel, count: int) -> list[Choice]:
    client = model.openai_client()
    choices = []
    for _ in range(count):
        completion = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=PROMPT,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=1.0,
            logprobs=True,
        )
        choices.append(completion.choices[0])
    return choices


def completion_logprobs(
    default_model: tuple[Any, Any], checkpoint: Path, choices: list[Choice]
) -> list[float]:
    """Each completion's total logprob given its prompt, under the PEFT adapter in
    `checkpoint` loaded by plain PEFT on a copy of the default model."""
    from peft import PeftModel

    base, _ = default_model
    scorer = PeftModel.from_pretrained(copy.deepcopy(base), str(checkpoint))
    totals = []
    with torch.no_grad():
        for choice in choices:
            extra = choice.model_extra or {}
            prompt, tokens = extra["prompt_token_ids"], extra["token_ids"]
            ids = torch.tensor([prompt + tokens])
            logits = scorer(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])
            totals.append(float(picked.sum()))
    return totals


def history(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / "history.jsonl").read_text().splitlines()]


@pytest.mark.asyncio(loop_scope="session")
async def test_a_grpo_step_raises_the_rewarded_completion_and_lowers_the_others(
    backend: LocalBackend, model: art.TrainableModel, default_model: tuple[Any, Any]
) -> None:
    choices = await sample(model, 4)
    group = art.TrajectoryGroup(
        art.Trajectory(messages_and_choices=[*PROMPT, choice], reward=1.0 if i == 0 else 0.0)
        for i, choice in enumerate(choices)
    )
    await model.train([group], config=art.TrainConfig(learning_rate=2e-3))

    directory = model_dir(backend, model)
    before = completion_logprobs(default_model, directory / "checkpoints" / "0000", choices)
    after = completion_logprobs(default_model, directory / "checkpoints" / "0001", choices)
    assert after[0] > before[0] + 0.1, (before, after)
    for old, new in zip(before[1:], after[1:], strict=True):
        assert new < old, (before, after)
    (row,) = [row for row in history(directory) if "loss/train" in row]
    assert row["data/step_loss_bearing_tokens"] > 0
    assert row["train/peak_memory_gb"] > 0  # the child's own measurement
    assert row["loss/importance_ratio_mean"] == pytest.approx(1.0, abs=0.05)  # fp32 on both sides


@pytest.mark.asyncio(loop_scope="session")
async def test_its_checkpoint_is_served_by_the_transformers_engine(
    model: art.TrainableModel,
) -> None:
    client = model.openai_client()

    async def logprobs(name: str) -> list[float]:
        completion = await client.chat.completions.create(
            model=name,
            messages=PROMPT,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
            logprobs=True,
        )
        extra = completion.choices[0].model_extra or {}
        return [round(value, 4) for value in extra["token_logprobs"]]

    name = f"{model.project}/{model.name}"
    at_0, at_1, latest = (
        await logprobs(f"{name}@0"),
        await logprobs(f"{name}@1"),
        await logprobs(name),
    )
    assert at_1 != at_0
    assert latest == at_1  # the service's own copy holds what the child trained


@pytest.mark.asyncio(loop_scope="session")
async def test_sft_trains_through_the_unsloth_trainer(
    backend: LocalBackend, model: art.TrainableModel
) -> None:
    trajectories = [
        art.Trajectory(
            messages_and_choices=[*PROMPT, {"role": "assistant", "content": colour}], reward=0.0
        )
        for colour in ("Blue.", "Green.", "Red.", "Teal.")
    ]
    await model.train_sft(trajectories, art.TrainSFTConfig(learning_rate=1e-3, batch_size=2))
    rows = [row for row in history(model_dir(backend, model)) if "sft/loss/train" in row]
    assert len(rows) == 2
    assert all(row["sft/tokens"] > 0 for row in rows)
    assert await model.get_step() == 2


@pytest.mark.asyncio(loop_scope="session")
async def test_a_killed_trainer_fails_its_step_and_the_next_one_resumes_from_the_checkpoint(
    backend: LocalBackend, model: art.TrainableModel
) -> None:
    trainer = trainer_of(backend, model)
    os.kill(trainer.pid, signal.SIGKILL)
    choices = await sample(model, 2)
    group = art.TrajectoryGroup(
        art.Trajectory(messages_and_choices=[*PROMPT, choice], reward=float(i))
        for i, choice in enumerate(choices)
    )
    step = await model.get_step()
    with pytest.raises(art.TrainingError, match="exited with code -9"):
        await model.train([group], config=art.TrainConfig(learning_rate=1e-4))
    assert await model.get_step() == step  # nothing saved
    await model.train([group], config=art.TrainConfig(learning_rate=1e-4))
    assert await model.get_step() == step + 1
    assert trainer.pid is not None


@pytest.mark.asyncio(loop_scope="session")
async def test_a_4bit_base_trains_with_bitsandbytes_cpu_backend(
    tmp_path: Path, default_model: tuple[Any, Any]
) -> None:
    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    try:
        model = art.TrainableModel(
            name="quantized",
            project="unsloth",
            base_model=BASE,
            _internal_config=art.dev.InternalModelConfig(
                trainer_backend="unsloth",
                init_args=art.dev.InitArgs(dtype="bfloat16", load_in_4bit=True, max_seq_length=512),
            ),
        )
        await model.register(backend)
        choices = await sample(model, 2)
        group = art.TrajectoryGroup(
            art.Trajectory(messages_and_choices=[*PROMPT, choice], reward=float(i))
            for i, choice in enumerate(choices)
        )
        await model.train([group], config=art.TrainConfig(learning_rate=2e-3))
        directory = model_dir(backend, model)
        (row,) = [row for row in history(directory) if "loss/train" in row]
        assert row["data/step_loss_bearing_tokens"] > 0
        # The engine samples from the bf16 base, the trainer trains against its 4-bit
        # quantization: the gap shows in the importance ratio, measured here, not hidden
        # (exactly 1.0 would mean the trainer compared itself with itself). No tighter
        # bound: the mean ratio of 16 sampled tokens is the draw's (0.45 in one CI run on
        # an AVX512-BF16 EPYC, inside 0.5-2 alone there), so a range would test the draw.
        ratio = row["loss/importance_ratio_mean"]
        assert math.isfinite(ratio), ratio
        assert ratio > 0, ratio
        assert ratio != pytest.approx(1.0, abs=1e-6), ratio
        before = completion_logprobs(default_model, directory / "checkpoints" / "0000", choices)
        after = completion_logprobs(default_model, directory / "checkpoints" / "0001", choices)
        assert after[1] > before[1], (before, after)  # the rewarded one rose
    finally:
        await backend.close()


@pytest.mark.asyncio(loop_scope="session")
async def test_4bit_without_the_unsloth_trainer_is_refused_by_name(tmp_path: Path) -> None:
    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    try:
        model = art.TrainableModel(
            name="refused",
            project="unsloth",
            base_model=BASE,
            _internal_config=art.dev.InternalModelConfig(
                init_args=art.dev.InitArgs(load_in_4bit=True)
            ),
        )
        with pytest.raises(art.ConfigError, match="trainer_backend='unsloth'") as raised:
            await model.register(backend)
        assert raised.value.field == "_internal_config.init_args.load_in_4bit"
    finally:
        await backend.close()


def test_art_s_trainer_key_is_refused_naming_trainer_args_and_trainer_backend() -> None:
    with pytest.raises(art.ConfigError, match="trainer_backend") as raised:
        art.dev.InternalModelConfig(trainer={"learning_rate": 1e-5})  # type: ignore[call-arg]
    assert raised.value.field == "trainer"
    assert "trainer_args" in str(raised.value)


@pytest.mark.asyncio(loop_scope="session")
async def test_its_checkpoint_is_served_by_the_vllm_engine(tmp_path: Path) -> None:
    from art.runtime.engines.vllm.server import find_vllm_python

    if find_vllm_python() is None:
        pytest.skip("no vLLM environment: run `make venv-vllm` (or set ART_VLLM_PYTHON)")
    with one_at_a_time("vllm"):
        await _serve_a_checkpoint_with_vllm(tmp_path)


async def _serve_a_checkpoint_with_vllm(tmp_path: Path) -> None:
    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    try:
        model = art.TrainableModel(
            name="served",
            project="unsloth",
            base_model=BASE,
            _internal_config=art.dev.InternalModelConfig(
                engine="vllm",
                trainer_backend="unsloth",
                init_args=art.dev.InitArgs(dtype="float32", max_seq_length=512),
            ),
        )
        await model.register(backend)
        choices = await sample(model, 2)
        group = art.TrajectoryGroup(
            art.Trajectory(messages_and_choices=[*PROMPT, choice], reward=float(i))
            for i, choice in enumerate(choices)
        )
        await model.train([group], config=art.TrainConfig(learning_rate=2e-3))
        client = model.openai_client()

        async def logprobs(name: str) -> list[float]:
            completion = await client.chat.completions.create(
                model=name,
                messages=PROMPT,  # type: ignore[arg-type]
                max_tokens=8,
                temperature=0,
                logprobs=True,
            )
            extra = completion.choices[0].model_extra or {}
            return [round(value, 4) for value in extra["token_logprobs"]]

        name = f"{model.project}/{model.name}"
        at_0, at_1 = await logprobs(f"{name}@0"), await logprobs(f"{name}@1")
        assert at_1 != at_0
        assert await logprobs(name) == at_1
    finally:
        await backend.close()
