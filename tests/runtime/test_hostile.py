"""Hostile traffic against LocalBackend's endpoint, on the real default model.

One bad or vanished client fails only itself: its rows leave the engine's batch, its
neighbours finish with the outputs they would have had, and `/health` keeps answering
while a huge request is worked on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

import art
from art.core.store.model_store import ModelStore
from art.local import LocalBackend
from art.runtime.engines.transformers.engine import TransformersEngine

pytestmark = pytest.mark.model  # loads the default model or starts a model service

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
WAIT_S = 300.0  # how long a condition may take on a loaded 2-core machine before it fails


@pytest.fixture(scope="module")
def backend_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile") / ".art"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def backend(backend_path: Path) -> AsyncIterator[LocalBackend]:
    backend = LocalBackend(path=backend_path, in_process=True)
    yield backend
    await backend.close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(backend: LocalBackend) -> art.TrainableModel:
    # fp32: bf16 sums depend on a batch's padding, so greedy outputs would too.
    model = art.TrainableModel(
        name="hostile",
        project="tests",
        base_model=BASE,
        _internal_config=art.dev.InternalModelConfig(init_args=art.dev.InitArgs(dtype="float32")),
    )
    await model.register(backend)
    return model


@pytest.fixture
def engine(backend: LocalBackend, served: art.TrainableModel) -> TransformersEngine:
    from art.runtime.service.model_service import ModelService

    service = backend._model_service()
    assert isinstance(service, ModelService)
    return service.route(served.name).engine


@pytest_asyncio.fixture(loop_scope="session")
async def http(served: art.TrainableModel) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {served.inference_api_key}"}
    base_url = str(served.inference_base_url)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=600) as client:
        yield client


def ask(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


async def eventually(condition: Callable[[], bool], what: str) -> None:
    """Wait for `condition`; fail naming `what` if it never holds (a liveness bound only)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not condition():
        assert loop.time() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.05)


async def stream_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line.removeprefix("data: "))


async def test_abandoned_and_broken_requests_fail_alone(
    served: art.TrainableModel, http: httpx.AsyncClient, engine: TransformersEngine
) -> None:
    """32 streams: 8 clients vanish mid-stream, 1 sends a seed torch refuses, 23 finish."""
    prompts = [
        f"Name an animal whose name starts with {letter}." for letter in "ABCDEFGHIJKLMNOPQRSTUVW"
    ]

    def body(content: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
        return {
            "model": served.name,
            "messages": ask(content),
            "max_tokens": max_tokens,
            "temperature": 0,
            **extra,
        }

    # What each of the 23 answers without hostile neighbours: greedy in fp32, so the
    # batch it shares does not change it.
    alone = await asyncio.gather(
        *(http.post("/chat/completions", json=body(prompt, 6)) for prompt in prompts)
    )
    assert all(response.status_code == 200 for response in alone)
    expected = [response.json()["choices"][0]["token_ids"] for response in alone]

    # 8 long streams (a greedy story runs for hundreds of tokens), each read to its first text.
    long_body = body("Write a very long story about a dragon.", 2000, stream=True)
    abandoned: list[tuple[Any, httpx.Response]] = []
    for _ in range(8):
        context = http.stream("POST", "/chat/completions", json=long_body)
        response = await context.__aenter__()
        assert response.status_code == 200
        events = stream_events(response)
        while not (await anext(events))["choices"][0]["delta"].get("content"):
            pass
        abandoned.append((context, response))

    finished: list[bool] = [False] * len(prompts)

    async def normal(index: int) -> list[int]:
        async with http.stream(
            "POST", "/chat/completions", json=body(prompts[index], 6, stream=True)
        ) as response:
            assert response.status_code == 200
            token_ids: list[int] = []
            async for event in stream_events(response):
                for choice in event["choices"]:
                    if choice.get("finish_reason"):
                        token_ids = choice["token_ids"]
        finished[index] = True
        return token_ids

    async def bad_seed() -> httpx.Response:
        return await http.post(
            "/chat/completions", json=body(prompts[0], 6, stream=True, seed=2**70)
        )

    async def abandon_one_by_one() -> None:
        for closed, (context, response) in enumerate(abandoned, start=1):
            await response.aclose()
            await context.__aexit__(None, None, None)
            # The engine holds at most the long streams still open plus the short ones
            # still running; rows of a vanished client would keep it above that.
            await eventually(
                lambda closed=closed: engine.active_rows <= 8 - closed + finished.count(False),
                f"the engine dropping abandoned stream {closed}",
            )

    normals = asyncio.gather(*(normal(i) for i in range(len(prompts))))
    refused, _, outputs = await asyncio.gather(bad_seed(), abandon_one_by_one(), normals)

    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "seed"
    assert outputs == expected
    await eventually(lambda: engine.active_rows == 0, "an idle engine")
    still = await http.post("/chat/completions", json=body("Say hi.", 4))
    assert still.status_code == 200


async def test_a_request_whose_callback_raises_or_whose_seed_torch_refuses_fails_alone(
    backend: LocalBackend, served: art.TrainableModel, engine: TransformersEngine
) -> None:
    """Straight at the engine, past the endpoint's checks: the neighbours still finish."""
    from art.runtime.engines.base import SamplingParams
    from art.runtime.service.model_service import ModelService

    service = backend._model_service()
    assert isinstance(service, ModelService)
    adapter = service.route(served.name).adapter
    prompt = engine.tokenizer("Name a fruit.", add_special_tokens=False).input_ids
    greedy = SamplingParams(max_tokens=6, temperature=0)

    def explode(index: int, token: int) -> None:
        raise RuntimeError("the client's callback broke")

    alone = await engine.generate(prompt, greedy, adapter=adapter)
    results = await asyncio.gather(
        engine.generate(prompt, greedy, adapter=adapter),
        engine.generate(prompt, greedy, adapter=adapter, on_token=explode),
        engine.generate(prompt, SamplingParams(max_tokens=6, seed=2**70), adapter=adapter),
        engine.generate(prompt, greedy, n=2, adapter=adapter),
        return_exceptions=True,
    )
    ok, broken, seeded, pair = results
    assert isinstance(broken, RuntimeError)
    assert "callback broke" in str(broken)
    assert isinstance(seeded, ValueError)  # torch: the seed does not fit 64 bits
    assert isinstance(ok, list)
    assert isinstance(pair, list)
    assert ok[0].token_ids == alone[0].token_ids
    assert [sample.token_ids for sample in pair] == [alone[0].token_ids] * 2
    await eventually(lambda: engine.active_rows == 0, "an idle engine")


async def test_a_non_streaming_client_that_disconnects_frees_its_rows(
    served: art.TrainableModel, http: httpx.AsyncClient, engine: TransformersEngine
) -> None:
    long_body = {
        "model": served.name,
        "messages": ask("Write a very long story about a dragon."),
        "max_tokens": 2000,
        "temperature": 0,
        "n": 4,
    }
    request = asyncio.ensure_future(http.post("/chat/completions", json=long_body))
    await eventually(lambda: engine.active_rows == 4, "the request's 4 rows decoding")
    request.cancel()  # the client closes its connection
    with pytest.raises(asyncio.CancelledError):
        await request
    await eventually(lambda: engine.active_rows == 0, "the engine dropping the 4 rows")


async def test_health_and_small_requests_answer_while_a_huge_one_is_worked_on(
    served: art.TrainableModel, http: httpx.AsyncClient
) -> None:
    small = {"model": served.name, "messages": ask("Say hi."), "max_tokens": 4}
    # Near the body limit: parsed and tokenized (off the event loop), then refused.
    text = "word " * 180_000
    big = {"model": served.name, "messages": ask(text), "max_tokens": 4}
    root = str(served.inference_base_url).removesuffix("/v1")

    async def huge() -> httpx.Response:
        return await http.post("/chat/completions", content=b"x" * 50_000_000)

    async def beside() -> tuple[httpx.Response, httpx.Response]:
        await asyncio.sleep(0.05)  # the big bodies are on their way
        health = await http.get(f"{root}/health")
        completion = await http.post("/chat/completions", json=small)
        return health, completion

    too_large, too_long, (health, completion) = await asyncio.gather(
        huge(), http.post("/chat/completions", json=big), beside()
    )
    assert too_large.status_code == 413
    assert too_large.json()["error"]["param"] == "body"
    assert too_long.status_code == 400
    assert too_long.json()["error"]["code"] == "context_length_exceeded"
    assert health.status_code == 200
    assert completion.status_code == 200
    assert completion.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize(
    ("change", "status", "param"),
    [
        ({"seed": 2**70}, 400, "seed"),
        ({"seed": -1}, 400, "seed"),
        ({"n": 0}, 400, "n"),
        ({"n": 1000}, 400, "n"),
        ({"top_logprobs": 21}, 400, "top_logprobs"),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"max_tokens": "lots"}, 400, "max_tokens"),
        ({"temperature": "hot"}, 400, "temperature"),
        ({"stop": 5}, 400, "stop"),
        ({"stop": ""}, 400, "stop"),
        ({"messages": [{"role": "user", "content": "hi"}, 7]}, 400, "messages[1]"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
        ({"tool_choice": {"type": "function", "function": 3}}, 400, "tool_choice"),
        ({"tool_choice": "sometimes"}, 400, "tool_choice"),
        ({"stream_options": {"include_usage": "yes please"}}, 400, "stream_options.include_usage"),
        ({"response_format": {"type": "json_schema"}}, 400, "response_format"),
        ({"model": ["a"]}, 400, "model"),
    ],
)
async def test_every_bad_field_is_a_4xx_naming_it(
    served: art.TrainableModel,
    http: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
    change: dict[str, Any],
    status: int,
    param: str,
) -> None:
    body = {"model": served.name, "messages": ask("Hi"), "max_tokens": 4, **change}
    with caplog.at_level(logging.INFO, logger="art.endpoint"):
        response = await http.post("/chat/completions", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert param in error["message"]
    refusals = [record for record in caplog.records if record.name == "art.endpoint"]
    assert len(refusals) == 1  # one line per refused request
    assert refusals[0].exc_info is None  # and no traceback


@pytest.mark.parametrize(
    "raw", [b"{not json", b'{"model": "x", "messages": [', b"[1, 2]", b"\xff\xfe", b""]
)
async def test_malformed_bodies_are_a_400_about_the_body(
    http: httpx.AsyncClient, raw: bytes
) -> None:
    response = await http.post(
        "/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "body"  # not a character position
    assert "body" in error["message"]


# --- nothing written that did not happen ----------------------------------------------


async def trainee(backend: LocalBackend, name: str) -> art.TrainableModel:
    model = art.TrainableModel(
        name=name,
        project="tests",
        base_model=BASE,
        _internal_config=art.dev.InternalModelConfig(init_args=art.dev.InitArgs(dtype="float32")),
    )
    await model.register(backend)
    return model


async def sampled(model: art.TrainableModel, reward: float) -> art.Trajectory:
    """A turn sampled through the model's endpoint: a Choice with its token ids."""
    messages = ask("Say a color.")
    completion = await model.openai_client().chat.completions.create(
        model=model.name,
        messages=messages,
        max_tokens=4,  # type: ignore[arg-type]
    )
    return art.Trajectory(messages_and_choices=[*messages, completion.choices[0]], reward=reward)


def plain(reward: float) -> art.Trajectory:
    """A conversation whose assistant turn was not sampled here: nothing to train exactly."""
    return art.Trajectory(
        messages_and_choices=[*ask("Say a color."), {"role": "assistant", "content": "Blue."}],
        reward=reward,
    )


async def test_training_with_nothing_sampled_is_refused_before_anything_is_written(
    backend: LocalBackend, backend_path: Path
) -> None:
    model = await trainee(backend, "unsampled")
    run = backend_path / "tests" / "models" / "unsampled"
    before = sorted(path.relative_to(run) for path in run.rglob("*"))
    groups = [art.TrajectoryGroup([plain(0.0), plain(1.0)])]
    with pytest.raises(art.TrajectoryValidationError, match="nothing to train"):
        await model.train(groups)
    failed = art.TrajectoryGroup([ValueError("rollout crashed"), ValueError("again")])
    with pytest.raises(art.TrajectoryValidationError, match="every rollout failed"):
        await model.train([failed])
    assert sorted(path.relative_to(run) for path in run.rglob("*")) == before
    assert await model.get_step() == 0

    # Asked for: plain assistant turns are trained on their re-encoded text.
    await model.train(groups, _config=art.dev.TrainConfig(allow_training_without_logprobs=True))
    assert await model.get_step() == 1


async def test_a_retried_train_logs_its_trajectories_once(
    backend: LocalBackend, backend_path: Path, chat_server_url: str
) -> None:
    model = await trainee(backend, "retried")
    good = art.TrajectoryGroup([await sampled(model, 0.0), await sampled(model, 1.0)])
    mixed = art.TrajectoryGroup([await sampled(model, 0.0), plain(1.0)])
    foreign = await httpx.AsyncClient().post(
        f"{chat_server_url}/chat/completions", json={"model": "x", "messages": ask("Say a color.")}
    )
    from openai.types.chat.chat_completion import Choice

    unsampled = Choice.model_validate(foreign.json()["choices"][0])  # no token ids
    mixed.trajectories[1].messages_and_choices[-1] = unsampled
    groups = [good, mixed]
    with pytest.raises(art.TrainingError, match="has no token ids"):
        await model.train(groups)  # fails in the trainer, after the groups were logged
    await model.train(groups, _config=art.dev.TrainConfig(allow_training_without_logprobs=True))
    assert await model.get_step() == 1
    stored = ModelStore(backend_path, "tests", "retried").read_trajectories("train", 0)
    assert len(stored) == 2
    assert [len(group.trajectories) for group in stored] == [2, 2]


# --- a dead or interrupted service child ----------------------------------------------

_START_SERVICE = """
import os, signal, sys, time
# A program started from a terminal: SIGINT raises KeyboardInterrupt. Ignored or blocked
# signals pass through exec, and the pytest worker that starts this may have either from
# an earlier test's library; then the SIGINT would never land (CI saw this script sleep
# through it for 300 s).
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
signal.signal(signal.SIGINT, signal.default_int_handler)
from art.local import LocalBackend
backend = LocalBackend(path=sys.argv[1])
service = backend._model_service()
print(service._process.pid, flush=True)
time.sleep(600)
"""


def test_the_service_child_holds_no_key_in_its_environment_and_sigint_leaves_no_temp_dir(
    tmp_path: Path,
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    script = subprocess.Popen(
        [sys.executable, "-c", _START_SERVICE, str(tmp_path / ".art")],
        # PYTHONFAULTHANDLER: a SIGABRT prints every thread's stack (see below).
        env={
            **os.environ,
            "TMPDIR": str(temp),
            "PYTHONPATH": os.getcwd(),
            "PYTHONFAULTHANDLER": "1",
        },
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert script.stdout is not None
        child = int(script.stdout.readline())
        environment = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        assert not [entry for entry in environment if b"AUTHKEY" in entry.upper()]
        assert list(temp.iterdir()) == []  # the socket's directory is gone once connected
        # Nothing art did in the script blocks SIGINT or takes it from Python's handler.
        assert _sigint_state(script.pid) == {"blocked": False, "ignored": False, "caught": True}
        script.send_signal(signal.SIGINT)
        # KeyboardInterrupt, no cleanup code of ours ran. WAIT_S, not less: on a loaded
        # machine the child may still be importing torch when the signal lands.
        try:
            code = script.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            # Seen once in CI (2026-11-25, not reproduced alone): the script outlived the
            # SIGINT by 300 s. Its stacks then go to the captured stderr, for the cause.
            script.send_signal(signal.SIGABRT)
            script.wait(timeout=30)
            raise AssertionError(
                f"the script (pid {script.pid}) did not exit {WAIT_S:.0f} s after SIGINT; "
                "every thread's stack is in the captured stderr; this worker's SIGINT: "
                f"{_sigint_state(os.getpid())}"
            ) from None
        assert code != 0
        # The child exits when its parent's socket closes.
        deadline = time.monotonic() + WAIT_S
        while Path(f"/proc/{child}").exists() and _state(child) != "Z":
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.1)
        assert list(temp.iterdir()) == []
    finally:
        if script.poll() is None:
            script.kill()


def _sigint_state(pid: int) -> dict[str, bool]:
    """Whether SIGINT is blocked, ignored or caught by process `pid`'s main thread."""
    fields = dict(
        line.split(":\t", 1)
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith(("SigBlk", "SigIgn", "SigCgt"))
    )
    bit = 1 << (signal.SIGINT - 1)
    return {
        name: bool(int(fields[field], 16) & bit)
        for name, field in (("blocked", "SigBlk"), ("ignored", "SigIgn"), ("caught", "SigCgt"))
    }


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return "gone"


ALLOW = art.dev.TrainConfig(allow_training_without_logprobs=True)
