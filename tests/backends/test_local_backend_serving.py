"""LocalBackend on the real default model: the OpenAI endpoint, training, checkpoints, resume.

One backend (in this process) and one base model serve the whole module; models that
train get their own adapters on it, so they never disturb the served one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from openai import AsyncOpenAI, NotFoundError

import art
from art.local import LocalBackend

pytestmark = pytest.mark.model  # loads the default model or starts a model service

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
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


@pytest.fixture(scope="module")
def backend(shared_backend: LocalBackend) -> LocalBackend:
    return shared_backend


@pytest.fixture(scope="module")
def backend_path(shared_backend: LocalBackend) -> Path:
    return Path(shared_backend.path)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(backend: LocalBackend) -> art.TrainableModel:
    model = art.TrainableModel(name="served", project="serving", base_model=BASE)
    await model.register(backend)
    return model


def ask(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


async def test_32_concurrent_requests_each_carry_token_ids_and_logprobs(
    served: art.TrainableModel,
) -> None:
    client = served.openai_client()
    completions = await asyncio.gather(
        *(
            client.chat.completions.create(
                model=served.name,
                messages=ask(f"Name a fruit that starts with the letter {letter}."),
                max_tokens=12,
                logprobs=True,
                top_logprobs=2,
            )
            for letter in "ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEF"
        )
    )
    assert len(completions) == 32
    for completion in completions:
        choice = completion.choices[0]
        extra = choice.model_extra or {}
        token_ids, sampled = extra["token_ids"], extra["token_logprobs"]
        assert isinstance(choice.message.content, str)
        assert completion.usage is not None
        assert 1 <= len(token_ids) <= 12
        assert len(token_ids) == completion.usage.completion_tokens
        assert len(extra["prompt_token_ids"]) == completion.usage.prompt_tokens
        assert choice.logprobs is not None
        assert choice.logprobs.content is not None
        assert len(choice.logprobs.content) == len(token_ids)
        for entry, logprob in zip(choice.logprobs.content, sampled, strict=True):
            assert math.isclose(entry.logprob, logprob, abs_tol=1e-6)
            assert logprob <= 0
            assert len(entry.top_logprobs) == 2
        assert choice.finish_reason in ("stop", "length")


async def test_the_sampled_ids_decode_to_the_returned_text(served: art.TrainableModel) -> None:
    completion = await served.openai_client().chat.completions.create(
        model=served.name, messages=ask("Say hello."), max_tokens=16, temperature=0
    )
    choice = completion.choices[0]
    from transformers import AutoTokenizer

    from art.runtime.models import default_model_dir

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    decoded = tokenizer.decode((choice.model_extra or {})["token_ids"], skip_special_tokens=True)
    assert decoded == choice.message.content


async def test_a_forced_tool_choice_comes_back_as_a_parsed_tool_call(
    served: art.TrainableModel,
) -> None:
    completion = await served.openai_client().chat.completions.create(
        model=served.name,
        messages=[
            {"role": "system", "content": "You check the weather with the get_weather tool."},
            {"role": "user", "content": "What is the weather in Paris?"},
        ],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=32,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert isinstance(json.loads(call.function.arguments), dict)  # type: ignore[union-attr]
    assert call.id.startswith("call_")


async def test_n_seed_and_stop_are_honoured(served: art.TrainableModel) -> None:
    client = served.openai_client()

    async def sample() -> list[str]:
        completion = await client.chat.completions.create(
            model=served.name, messages=ask("Tell me a story."), max_tokens=12, n=3, seed=11
        )
        return [choice.message.content or "" for choice in completion.choices]

    first, second = await sample(), await sample()
    assert len(first) == 3
    assert first == second
    assert len(set(first)) > 1

    stopped = await client.chat.completions.create(
        model=served.name,
        messages=ask("Count from 1 to 10, separated by commas."),
        max_tokens=40,
        temperature=0,
        stop=["4"],
    )
    assert "4" not in (stopped.choices[0].message.content or "")
    assert stopped.choices[0].finish_reason == "stop"


async def test_streaming_sends_the_text_as_it_is_sampled(served: art.TrainableModel) -> None:
    client = served.openai_client()
    stream = await client.chat.completions.create(
        model=served.name,
        messages=ask("Describe the sea."),
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    deltas, last_choice, usage = [], None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            deltas.append(choice.delta.content or "")
            last_choice = choice
    whole = await client.chat.completions.create(
        model=served.name, messages=ask("Describe the sea."), max_tokens=16, temperature=0
    )
    assert len([d for d in deltas if d]) > 2
    assert "".join(deltas) == whole.choices[0].message.content
    assert last_choice is not None
    assert last_choice.finish_reason in ("stop", "length")
    assert (last_choice.model_extra or {})["token_ids"] == (whole.choices[0].model_extra or {})[
        "token_ids"
    ]
    assert usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


async def test_a_stream_with_stop_strings_sends_text_as_it_comes_and_nothing_past_the_stop(
    served: art.TrainableModel,
) -> None:
    """A stop string taken from the middle of the greedy answer: the stream (chat and
    completions) sends the text before it in several deltas, as sampled, and they join
    to the answer a request that does not stream gets; nothing of the stop string or
    after it is sent."""
    client = served.openai_client()
    messages = ask("Count from 1 to 30, separated by commas.")
    whole = await client.chat.completions.create(
        model=served.name, messages=messages, max_tokens=48, temperature=0
    )
    text = whole.choices[0].message.content or ""
    stop = text[len(text) // 2 : len(text) // 2 + 6]
    assert text.find(stop) >= 8, text  # the answer before it has several tokens
    asked = {"model": served.name, "max_tokens": 48, "temperature": 0, "stop": [stop]}
    stopped = await client.chat.completions.create(messages=messages, **asked)
    answer = stopped.choices[0].message.content or ""
    assert answer == text[: text.find(stop)]
    assert stopped.choices[0].finish_reason == "stop"

    stream = await client.chat.completions.create(messages=messages, stream=True, **asked)
    deltas = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert len([d for d in deltas if d]) > 2  # as sampled, not whole at the end
    assert "".join(deltas) == answer

    prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10"
    plain = await client.completions.create(prompt=prompt, **{**asked, "stop": None})
    text = plain.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 6]
    assert text.find(stop) >= 8, text
    asked["stop"] = [stop]
    cut = (await client.completions.create(prompt=prompt, **asked)).choices[0].text
    pieces = [
        c.choices[0].text
        async for c in await client.completions.create(prompt=prompt, stream=True, **asked)
        if c.choices
    ]
    assert len([p for p in pieces if p]) > 2
    assert "".join(pieces) == cut
    assert cut == text[: text.find(stop)]


async def test_bad_requests_get_a_4xx_naming_the_problem_and_the_server_keeps_serving(
    served: art.TrainableModel,
) -> None:
    base_url = served.inference_base_url
    headers = {"Authorization": f"Bearer {served.inference_api_key}"}
    good = {"model": served.name, "messages": ask("Hi"), "max_tokens": 4}
    cases = [
        ({**good, "model": "no-such-model"}, 404, "no-such-model"),
        ({**good, "model": "served@99"}, 404, "no checkpoint"),
        ({**good, "max_tokens": -5}, 400, "max_tokens"),
        ({**good, "messages": [{"content": "no role"}]}, 400, "role"),
        ({**good, "messages": []}, 400, "messages"),
        ({**good, "temperature": 5}, 400, "temperature"),
        ({**good, "logit_bias": {"1": 5}}, 400, "logit_bias"),
        ({**good, "response_format": {"type": "xml"}}, 400, "response_format"),
        ({**good, "messages": ask("word " * 9_000)}, 400, "context"),
    ]
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120) as http:
        for body, status, words in cases:
            response = await http.post("/chat/completions", json=body)
            assert response.status_code == status, (body, response.text)
            error = response.json()["error"]
            assert words in error["message"], error
        response = await http.post(
            "/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert response.status_code == 400
        unauthorized = await http.post(
            "/chat/completions", json=good, headers={"Authorization": "Bearer wrong"}
        )
        assert unauthorized.status_code == 401
        still = await http.post("/chat/completions", json=good)
        assert still.status_code == 200
        assert still.json()["choices"][0]["message"]["role"] == "assistant"


async def test_models_route_by_name_step_and_base(served: art.TrainableModel) -> None:
    client = served.openai_client()
    listed = [model.id for model in (await client.models.list()).data]
    assert BASE in listed
    assert served.name in listed
    assert f"{served.name}@0" in listed
    for name in (served.name, f"{served.name}@0", BASE):
        completion = await client.chat.completions.create(
            model=name, messages=ask("Hi"), max_tokens=3
        )
        assert completion.model == name


async def rollout(model: art.TrainableModel, client: AsyncOpenAI, word: str) -> art.Trajectory:
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": f"Repeat the word {word}."}]
    )
    completion = await client.chat.completions.create(
        model=model.name, messages=trajectory.messages(), max_tokens=8
    )
    choice = completion.choices[0]
    trajectory.messages_and_choices.append(choice)
    trajectory.reward = (
        float(word in (choice.message.content or "").lower())
        + len(choice.message.content or "") / 100
    )
    return trajectory


async def test_two_training_steps_save_serve_and_resume(
    backend: LocalBackend, backend_path: Path
) -> None:
    model = art.TrainableModel(name="trained", project="serving", base_model=BASE)
    await model.register(backend)
    client = model.openai_client()
    probe = ask("Write one short sentence about cats.")
    before = await client.chat.completions.create(
        model=model.name, messages=probe, max_tokens=12, temperature=0
    )

    for step in range(2):
        assert await model.get_step() == step
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(rollout(model, client, word) for _ in range(4))
                for word in ("apple", "river")
            ),
            pbar_desc=None,
        )
        await model.train(groups, config=art.TrainConfig(learning_rate=5e-3))
    assert await model.get_step() == 2

    run = backend_path / "serving" / "models" / "trained"
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == ["0000", "0001", "0002"]
    for name in ("0001", "0002"):
        assert (run / "checkpoints" / name / "adapter_model.safetensors").is_file()
        config = json.loads((run / "checkpoints" / name / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == BASE

    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1]
    for row in rows:
        # ART 0.5.23's names, and its x-axis: the step the row belongs to
        assert row["training_step"] == row["step"]
        for metric in (
            "train/reward",
            "train/reward_std_dev",
            "train/exception_rate",
            "loss/train",
            "loss/grad_norm",
            "loss/entropy",
            "data/step_num_groups_submitted",
            "data/step_num_groups_trainable",
            "data/step_loss_bearing_tokens",
            "time/step_backend_train_s",
            "train/micro_batches",  # ours, under the split
        ):
            assert metric in row, metric
        for old in ("train/loss", "train/grad_norm", "train/num_groups", "train/train_seconds"):
            assert old not in row, old
        assert math.isfinite(row["loss/train"])
        assert row["data/step_loss_bearing_tokens"] > 0
    assert "time/step_rollout_s" in rows[1]
    assert (run / "trajectories" / "train" / "0000.parquet").is_file()
    assert (run / "trajectories" / "train" / "0001.parquet").is_file()

    # The latest checkpoint is what the model name serves now; step 1 and 0 stay reachable.
    after = await client.chat.completions.create(
        model=model.name, messages=probe, max_tokens=12, temperature=0
    )
    again_at_0 = await client.chat.completions.create(
        model=f"{model.name}@0", messages=probe, max_tokens=12, temperature=0
    )
    at_1 = await client.chat.completions.create(
        model=f"{model.name}@1", messages=probe, max_tokens=12, temperature=0
    )
    assert (again_at_0.choices[0].model_extra or {})["token_ids"] == (
        before.choices[0].model_extra or {}
    )["token_ids"]

    def fingerprint(completion: object) -> tuple[list[int], list[float]]:
        extra = completion.choices[0].model_extra or {}  # type: ignore[attr-defined]
        return extra["token_ids"], [round(x, 3) for x in extra["token_logprobs"]]

    assert fingerprint(after) != fingerprint(before)
    assert fingerprint(at_1) not in (fingerprint(before), fingerprint(after))

    # A second process on the same path continues at step 2 and serves checkpoint 2.
    script = textwrap.dedent(
        f"""
        import asyncio, json
        import art
        from art.local import LocalBackend

        async def main():
            backend = LocalBackend(path={str(backend_path)!r})
            model = art.TrainableModel(name="trained", project="serving", base_model={BASE!r})
            await model.register(backend)
            completion = await model.openai_client().chat.completions.create(
                model=model.name, messages={probe!r}, max_tokens=12, temperature=0
            )
            print(json.dumps({{"step": await model.get_step(), "ids": completion.choices[0].model_extra["token_ids"]}}))
            await backend.close()

        asyncio.run(main())
        """
    )
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = json.loads(result.stdout.strip().splitlines()[-1])
    assert resumed["step"] == 2
    assert resumed["ids"] == (after.choices[0].model_extra or {})["token_ids"]


async def test_a_step_without_reward_variance_trains_nothing_but_advances(
    backend: LocalBackend, backend_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = art.TrainableModel(name="flat", project="serving", base_model=BASE)
    await model.register(backend)
    client = model.openai_client()

    async def constant(word: str) -> art.Trajectory:
        trajectory = await rollout(model, client, word)
        trajectory.reward = 0.5
        return trajectory

    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(constant("stone") for _ in range(3))], pbar_desc=None
    )
    with caplog.at_level(logging.WARNING, logger="art"):
        await model.train(groups)
    assert await model.get_step() == 1
    assert "flat step 1: every group's rewards are equal" in caplog.text  # the user is told
    row = json.loads(
        (backend_path / "serving" / "models" / "flat" / "history.jsonl")
        .read_text()
        .splitlines()[-1]
    )
    assert row["data/step_loss_bearing_tokens"] == 0
    assert row["data/step_num_groups_trainable"] == 0


async def test_a_deleted_model_is_unloaded_its_files_removed_and_its_name_starts_afresh(
    backend: LocalBackend, backend_path: Path
) -> None:
    model = art.TrainableModel(name="doomed", project="serving", base_model=BASE)
    await model.register(backend)
    client = model.openai_client()
    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout(model, client, "stone") for _ in range(2))], pbar_desc=None
    )
    await model.train(groups)  # a step: a checkpoint, history and a writer lock to remove
    assert await model.get_step() == 1
    directory = backend_path / "serving" / "models" / "doomed"
    assert (directory / "checkpoints" / "0001").is_dir()

    await backend.delete(model)
    assert not directory.exists()
    assert [p.name for p in directory.parent.iterdir() if "doomed" in p.name] == []
    with pytest.raises(NotFoundError):  # no longer served, under any step
        await client.chat.completions.create(
            model=model.get_inference_name(), messages=ask("Hi."), max_tokens=2
        )
    await backend.delete(model)  # nothing left to delete: a no-op

    again = art.TrainableModel(name="doomed", project="serving", base_model=BASE)
    await again.register(backend)
    assert await again.get_step() == 0
    answer = await again.openai_client().chat.completions.create(
        model=again.get_inference_name(), messages=ask("Hi."), max_tokens=2
    )
    assert answer.choices[0].message.content is not None


async def test_choices_without_sampled_ids_are_refused_before_anything_is_written(
    backend: LocalBackend, backend_path: Path, chat_server_url: str
) -> None:
    """Choices from another endpoint carry no token ids: training says why, writes nothing."""
    model = art.TrainableModel(name="foreign", project="serving", base_model=BASE)
    await model.register(backend)
    other = AsyncOpenAI(base_url=chat_server_url, api_key="k")

    async def foreign(reward: float) -> art.Trajectory:
        completion = await other.chat.completions.create(model="x", messages=ask("hi"))
        return art.Trajectory(
            messages_and_choices=[*ask("hi"), completion.choices[0]], reward=reward
        )

    groups = [await art.TrajectoryGroup([foreign(0.0), foreign(1.0)])]
    with pytest.raises(art.TrajectoryValidationError, match="allow_training_without_logprobs"):
        await model.train(groups)
    assert await model.get_step() == 0
    run = backend_path / "serving" / "models" / "foreign"
    assert (run / "checkpoints" / "0000" / "adapter_model.safetensors").is_file()
    assert not (run / "trajectories").exists()  # a step that did not happen is not logged

    await model.train(groups, _config=art.dev.TrainConfig(allow_training_without_logprobs=True))
    assert await model.get_step() == 1


async def test_an_unknown_base_model_fails_at_register(tmp_path: Path) -> None:
    backend = LocalBackend(path=tmp_path, in_process=True)
    try:
        missing = art.TrainableModel(name="m", project="p", base_model=str(tmp_path / "nowhere"))
        with pytest.raises(art.ConfigError, match="no directory"):
            await missing.register(backend)
        (tmp_path / "empty").mkdir()
        empty = art.TrainableModel(name="m2", project="p", base_model=str(tmp_path / "empty"))
        with pytest.raises(art.ConfigError, match="neither a model directory"):
            await empty.register(backend)
        offline = art.TrainableModel(name="m3", project="p", base_model="nobody/no-such-model-xyz")
        with pytest.raises(art.ConfigError, match="cannot load"):
            await offline.register(backend)
        # Nothing was recorded, so the corrected registration is not a "changed base model".
        assert not (tmp_path / "p" / "models" / "m3" / "model.json").exists()
        fixed = art.TrainableModel(name="m3", project="p", base_model=BASE)
        await fixed.register(backend)
        assert await fixed.get_step() == 0
    finally:
        await backend.close()
