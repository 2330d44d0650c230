"""The model service under concurrency: properties, not numbers.

Every wait here has a liveness deadline that turns a hang into a failure (the defects
these tests pin froze the server); none asserts how long anything took. Orderings are
shown by events: a request answered while a step holds the training model, a
registration that returns while a DELETE still waits.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from openai import NotFoundError

import art
from art.local import LocalBackend
from art.runtime.service.registry import on_training_model
from art.serve.schemas import ModelCreate
from art.serve.state import ArtServer

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEADLINE_S = 600  # liveness only: far above what any of this takes on 2 cores
DEDICATED = art.dev.InternalModelConfig(trainer_gpu_ids=[], inference_gpu_ids=[])
# Liveness, not speed: each test trains real steps on 2 cores that the rest may share.
pytestmark = [pytest.mark.model, pytest.mark.timeout(1800)]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalBackend]:
    backend = LocalBackend(path=tmp_path_factory.mktemp("concurrency") / ".art", in_process=True)
    yield backend
    await backend.close()


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def train_steps(model: art.TrainableModel, steps: int) -> None:
    """`steps` real GRPO steps on tiny rollouts (rewards differ, so each step trains)."""
    client = model.openai_client()

    async def rollout(word: str, index: int) -> art.Trajectory:
        trajectory = art.Trajectory(messages_and_choices=ask(f"Say {word}."))
        completion = await client.chat.completions.create(
            model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=4
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        trajectory.reward = len(choice.message.content or "") / 10 + index  # never a tie
        return trajectory

    for _ in range(steps):
        groups = await art.gather_trajectory_groups(
            [art.TrajectoryGroup(rollout("yes", index) for index in range(2))], pbar_desc=None
        )
        await model.train(groups, config=art.TrainConfig(learning_rate=1e-3))


async def until(condition: Callable[[], bool]) -> None:
    """Wait (in a thread) until `condition()` holds; fail at the liveness deadline."""

    def poll() -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not condition():
            assert time.monotonic() < deadline, "the condition never held"
            time.sleep(0.05)

    await asyncio.to_thread(poll)


def service_of(backend: LocalBackend) -> Any:
    service = backend.service
    assert service is not None
    return service


async def test_48_concurrent_requests_over_6_checkpoints_are_all_answered(
    backend: LocalBackend,
) -> None:
    """More checkpoints requested at once than are kept loaded (4): each request holds
    its checkpoint until it is answered, so none is unloaded under a waiting request."""
    model = art.TrainableModel(name="evals", project="concurrency", base_model=BASE)
    await model.register(backend)
    await train_steps(model, 6)
    client = model.openai_client()
    steps = [1 + i % 6 for i in range(48)]

    async def ask_checkpoint(step: int) -> int | None:
        completion = await client.chat.completions.create(
            model=f"{model.get_inference_name()}@{step}",
            messages=ask(f"Count to {step}."),
            max_tokens=3,
        )
        return completion.choices[0].model_extra["policy_version"]  # type: ignore[index]

    versions = await asyncio.wait_for(
        asyncio.gather(*(ask_checkpoint(step) for step in steps)), DEADLINE_S
    )
    assert versions == steps  # each answered by the checkpoint it named
    (base,) = service_of(backend)._bases.values()
    assert base.checkpoints.leased() == 0  # every lease released
    assert len(base.checkpoints.loaded()) <= base.checkpoints.keep  # back within bounds


async def test_requests_waiting_for_a_model_that_is_unloaded_are_answered_404(
    backend: LocalBackend,
) -> None:
    """A request queued for an adapter that goes away is answered, never held."""
    model = art.TrainableModel(name="doomed", project="concurrency", base_model=BASE)
    await model.register(backend)
    service = service_of(backend)
    base = service._models["concurrency/doomed"].base
    engine = base.engine
    client = model.openai_client().with_options(max_retries=0)
    paused, resume = threading.Event(), threading.Event()

    def hold_the_engine() -> None:  # what a training step holds, from another thread
        with engine.paused():
            paused.set()
            resume.wait(DEADLINE_S)

    holder = threading.Thread(target=hold_the_engine)
    holder.start()
    assert await asyncio.to_thread(paused.wait, DEADLINE_S)
    requests = [
        asyncio.ensure_future(
            client.chat.completions.create(
                model=model.get_inference_name(), messages=ask("Hello"), max_tokens=4
            )
        )
        for _ in range(6)
    ]
    await until(lambda: engine._queue.qsize() + len(engine._held) == 6)  # all reached it
    unloading = asyncio.ensure_future(asyncio.to_thread(service.unload, "concurrency", "doomed"))
    resume.set()  # the unload takes the engine next; then the waiting requests are answered
    await asyncio.wait_for(unloading, DEADLINE_S)
    results = await asyncio.wait_for(asyncio.gather(*requests, return_exceptions=True), DEADLINE_S)
    holder.join()
    assert all(isinstance(result, NotFoundError) for result in results), results
    assert "no longer served" in str(results[0])
    assert not engine._held
    assert engine._queue.empty()


async def test_dedicated_mode_answers_a_request_while_a_step_holds_the_training_model(
    tmp_path: Path,
) -> None:
    """The order of events: the training model is held; a request is answered; only then
    is it let go. In shared mode the request would wait for the release (and the deadline
    would fail this test)."""
    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    try:
        model = art.TrainableModel(
            name="beside", project="concurrency", base_model=BASE, _internal_config=DEDICATED
        )
        await model.register(backend)
        service = service_of(backend)
        base = service._models["concurrency/beside"].base
        assert base.engine.serves_while_training
        # Its steps leave glibc's mmap threshold to the decode loop beside them.
        assert service._models["concurrency/beside"].trainer.overlaps_decoding
        events: list[str] = []
        held, release = threading.Event(), threading.Event()

        def step() -> None:
            events.append("step holds the training model")
            held.set()
            release.wait(DEADLINE_S)
            events.append("step lets go")

        stepping = asyncio.ensure_future(
            asyncio.to_thread(on_training_model, base, step, service._torch)
        )
        assert await asyncio.to_thread(held.wait, DEADLINE_S)
        completion = await asyncio.wait_for(
            model.openai_client().chat.completions.create(
                model=model.get_inference_name(), messages=ask("Hi"), max_tokens=4
            ),
            DEADLINE_S,
        )
        events.append("request answered")
        release.set()
        await asyncio.wait_for(stepping, DEADLINE_S)
        assert completion.choices[0].message.content is not None
        assert events == [
            "step holds the training model",
            "request answered",
            "step lets go",
        ]
        await train_steps(model, 1)  # and a real step still trains and is served
        assert await model.get_step() == 1
    finally:
        await backend.close()


async def test_a_loaded_model_registered_with_another_config_is_refused(
    backend: LocalBackend,
) -> None:
    model = art.TrainableModel(name="configured", project="concurrency", base_model=BASE)
    await model.register(backend)
    # Engine arguments may change between processes, so only the loaded model refuses it.
    changed = art.TrainableModel(
        name="configured",
        project="concurrency",
        base_model=BASE,
        _internal_config=art.dev.InternalModelConfig(
            engine_args=art.dev.EngineArgs(max_num_seqs=8)
        ),
    )
    with pytest.raises(art.ConfigError) as refused:
        await changed.register(backend)
    assert refused.value.field == "_internal_config.engine_args"
    assert "max_num_seqs" in str(refused.value)
    assert "loaded with" in str(refused.value)
    # A sibling on the same base may not ask for another engine mode either.
    sibling = art.TrainableModel(
        name="sibling", project="concurrency", base_model=BASE, _internal_config=DEDICATED
    )
    with pytest.raises(art.ConfigError) as refused:
        await sibling.register(backend)
    assert refused.value.field == "_internal_config.trainer_gpu_ids"
    # The same config again is fine.
    await art.TrainableModel(name="configured", project="concurrency", base_model=BASE).register(
        backend
    )


async def test_a_stored_model_registered_with_another_lora_shape_is_refused(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """Across processes (a new backend on the same path), the engine may change, but a
    LoRA shape the checkpoints were not trained with may not."""
    model = art.TrainableModel(name="shaped", project="concurrency", base_model=BASE)
    await model.register(backend)
    later = LocalBackend(path=backend.path, in_process=True)
    try:
        reshaped = art.TrainableModel(
            name="shaped",
            project="concurrency",
            base_model=BASE,
            _internal_config=art.dev.InternalModelConfig(peft_args=art.dev.PeftArgs(r=16)),
        )
        with pytest.raises(art.ConfigError) as refused:
            await reshaped.register(later)
        assert refused.value.field == "_internal_config.peft_args"
    finally:
        await later.close()


@pytest.fixture(scope="module")
def art_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArtServer]:
    server = ArtServer(str(tmp_path_factory.mktemp("serve") / ".art"))
    yield server
    server.close()


async def test_a_delete_waiting_for_its_model_stalls_no_other_model(art_server: ArtServer) -> None:
    """DELETE waits for its own model's engine; meanwhile other models register."""
    art_server.register(ModelCreate(project="serve", name="gone", base_model=BASE))
    service = art_server.service
    engine = service._models["serve/gone"].base.engine
    paused, resume = threading.Event(), threading.Event()
    events: list[str] = []

    def hold_the_engine() -> None:  # a running batch of `gone`'s, as the DELETE sees it
        with engine.paused():
            paused.set()
            resume.wait(DEADLINE_S)

    holder = threading.Thread(target=hold_the_engine)
    holder.start()
    assert await asyncio.to_thread(paused.wait, DEADLINE_S)

    def delete() -> None:
        art_server.delete("serve~gone")
        events.append("delete returned")

    deleting = asyncio.ensure_future(asyncio.to_thread(delete))
    await until(lambda: "serve/gone" not in service._models)  # under way, waiting
    await asyncio.wait_for(
        asyncio.to_thread(
            art_server.register, ModelCreate(project="serve", name="other", trainable=False)
        ),
        DEADLINE_S,
    )
    events.append("other registered")
    resume.set()
    await asyncio.wait_for(deleting, DEADLINE_S)
    holder.join()
    assert events == ["other registered", "delete returned"]
    assert not (Path(art_server.path) / "serve" / "models" / "gone").exists()


async def test_register_train_log_delete_and_requests_interleaved(
    backend: LocalBackend,
) -> None:
    """Everything at once, for a bounded number of rounds; then the invariants: every
    request ended, no lock held, checkpoints and history agree with what was done."""
    model = art.TrainableModel(name="busy", project="concurrency", base_model=BASE)
    await model.register(backend)
    client = model.openai_client().with_options(max_retries=0)
    service = service_of(backend)
    answered: list[str] = []
    refused: list[str] = []

    async def requests(round_: int) -> None:
        for name in (model.get_inference_name(), f"{model.get_inference_name()}@0", BASE):
            try:
                await client.chat.completions.create(model=name, messages=ask("Go"), max_tokens=3)
                answered.append(name)
            except NotFoundError as error:  # a checkpoint deleted meanwhile: answered 404
                refused.append(f"{name}: {error}")

    async def one_round(round_: int) -> None:
        other = art.TrainableModel(name=f"extra{round_}", project="concurrency", base_model=BASE)
        await model.log(None, metrics={"score": float(round_)}, split="val")
        await asyncio.gather(
            train_steps(model, 1),
            requests(round_),
            requests(round_),
            other.register(backend),
            model.log(None, metrics={"score": float(round_)}, split="val"),
            model.delete_checkpoints("val/score"),
        )

    for round_ in range(3):
        await asyncio.wait_for(one_round(round_), DEADLINE_S)

    assert len(answered) + len(refused) == 3 * 2 * 3  # every request ended
    assert all("@0" in line for line in refused), refused  # only a deleted checkpoint 404s
    (base,) = service._bases.values()
    # No lock stays held (an evicted checkpoint unloads on a thread of its own, holding the
    # engine a moment: each lock must come free, and a hang fails at the deadline).
    await until(lambda: not base.train_lock.locked())
    await until(lambda: not base.engine._model_lock.locked())
    assert service._registry_lock.acquire(blocking=False)
    service._registry_lock.release()
    assert base.checkpoints.leased() == 0
    assert await model.get_step() == 3
    run = Path(backend.path) / "concurrency" / "models" / "busy"
    on_disk = sorted(int(p.name) for p in (run / "checkpoints").iterdir())
    assert on_disk[-1] == 3  # the latest always kept
    for step in on_disk:
        assert (run / "checkpoints" / f"{step:04d}" / "adapter_model.safetensors").is_file()
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert sum("loss/train" in row for row in rows) == 3  # one row per training step
    assert sum("val/score" in row for row in rows) == 6  # one per log call
    async with httpx.AsyncClient() as http:  # the endpoint lists exactly what is on disk
        listed = await http.get(
            f"{model.inference_base_url}/models",
            headers={"Authorization": f"Bearer {model.inference_api_key}"},
        )
    names = {entry["id"] for entry in listed.json()["data"]}
    assert {f"{model.get_inference_name()}@{step}" for step in on_disk} <= names


async def test_two_processes_training_one_model_never_lose_a_step(tmp_path: Path) -> None:
    """The second process is refused naming the first's pid while the first holds the
    model; once it is gone, a backend whose adapter is older than the latest checkpoint is
    refused too; a backend that loads the latest continues the lineage."""
    path = tmp_path / ".art"
    first = LocalBackend(path=path)  # the model service in a child process
    second = LocalBackend(path=path, in_process=True)
    try:
        model_a = art.TrainableModel(name="shared", project="concurrency", base_model=BASE)
        model_b = art.TrainableModel(name="shared", project="concurrency", base_model=BASE)
        await model_a.register(first)
        await model_b.register(second)  # loading it to serve or evaluate is fine
        await train_steps(model_a, 1)
        holder = first.service._process.pid  # type: ignore[union-attr]
        with pytest.raises(art.ConfigError, match=f"pid {holder}") as refused:
            await train_steps(model_b, 1)
        assert type(refused.value).__name__ == "ModelInUseError"
        await first.close()  # the holder exits; its lock goes with it
        with pytest.raises(art.ConfigError, match="has checkpoint 1, written after"):
            await train_steps(model_b, 1)
        assert await model_b.get_step() == 1  # nothing written over step 1
    finally:
        await first.close()
        await second.close()
    third = LocalBackend(path=path, in_process=True)
    try:
        model_c = art.TrainableModel(name="shared", project="concurrency", base_model=BASE)
        await model_c.register(third)
        await train_steps(model_c, 1)
        assert await model_c.get_step() == 2
    finally:
        await third.close()
