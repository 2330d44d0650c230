"""RayBackend on a local Ray cluster (CPU): two replicas behind the OpenAI front, a
trainer group of two gloo workers, the real default model.

One backend and one model serve the module; the tests run in order (a replica is killed
late, a trainer worker last).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from safetensors.torch import load_file

import art
from art.backends.ray import RayBackend, RayConfig
from art.backends.ray.sticky import StickyTable
from art.core.store.model_store import ModelStore
from art.pipeline_trainer import PipelineTrainer
from art.runtime import models
from art.runtime.service.placement import TrainerSpec

pytestmark = pytest.mark.model  # loads the default model or starts a model service

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


# --- no cluster needed -------------------------------------------------------------------


def test_config_fields_are_checked_and_named() -> None:
    with pytest.raises(art.ConfigError, match="replicas"):
        RayConfig(replicas=0)
    with pytest.raises(art.ConfigError, match="trainer_gpus"):
        RayConfig(trainer_gpus=0.5)
    with pytest.raises(art.ConfigError, match="no setting 'replica_gpu'"):
        RayConfig(replica_gpu=1)  # type: ignore[call-arg]
    node = {"CPU": 4.0}
    with pytest.raises(art.ConfigError, match=r"RayConfig\.replica_gpus"):
        RayConfig(replica_gpus=1).check_fits([node])
    with pytest.raises(art.ConfigError, match=r"RayConfig\.trainer_cpus"):
        RayConfig(trainer_cpus=8).check_fits([node])
    with pytest.raises(art.ConfigError, match=r"RayConfig\.replicas.*need 5 CPUs"):
        RayConfig(replicas=4).check_fits([node])
    RayConfig(replicas=2, trainer_workers=2).check_fits([node])  # fits exactly
    # Tensor parallelism is refused at once, not after a trainer group and checkpoint 0.
    with pytest.raises(art.ConfigError, match=r"RayConfig\.replica_gpus.*tensor parallelism"):
        RayConfig(replica_gpus=2)


def test_sticky_table_follows_a_conversation_not_a_shared_prompt() -> None:
    table = StickyTable()
    prompt = [1, 2, 3]
    table.record(prompt, [7, 8, 9, 10], replica=0)
    table.record(prompt, [5, 6], replica=1)
    assert table.find(prompt) is None  # a group's shared first prompt is not sticky
    assert table.find([*prompt, 7, 8, 9, 10, 11, 12]) == 0  # the next turn, exactly
    assert table.find([*prompt, 5, 6, 4]) == 1
    # A reply that re-tokenized differently at its end still matches its cut points.
    table.record(prompt, list(range(100, 120)), replica=1)
    assert table.find([*prompt, *range(100, 117), 999]) == 1
    table.forget(1)
    assert table.find([*prompt, 5, 6, 4]) is None


# --- on the cluster ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def backend_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray") / ".art"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def backend(ray_cluster: None, backend_path: Path) -> AsyncIterator[RayBackend]:
    backend = RayBackend(config=RayConfig(replicas=2, trainer_workers=2), path=backend_path)
    yield backend
    await backend.close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def model(backend: RayBackend) -> art.TrainableModel:
    model = art.TrainableModel(name="agent", project="ray", base_model=BASE)
    await model.register(backend)
    return model


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models.resolve(BASE).weights)


def replicas(backend: RayBackend) -> list[dict[str, Any]]:
    engines = backend.status()["engines"]
    assert len(engines) == 1
    return [status for status in engines[0] if status is not None]


async def ask(model: art.TrainableModel, messages: list[dict[str, str]], **kwargs: Any) -> Any:
    completion = await model.openai_client().chat.completions.create(
        model=kwargs.pop("name", model.get_inference_name()),
        messages=messages,  # type: ignore[arg-type]
        max_tokens=kwargs.pop("max_tokens", 6),
        **kwargs,
    )
    return completion.choices[0]


async def test_a_config_the_cluster_cannot_hold_is_refused_before_anything_starts(
    ray_cluster: None, tmp_path: Path
) -> None:
    backend = RayBackend(config=RayConfig(replica_cpus=64), path=tmp_path / ".art")
    model = art.TrainableModel(name="big", project="ray", base_model=BASE)
    with pytest.raises(art.ConfigError, match=r"RayConfig\.replica_cpus"):
        await model.register(backend)
    assert backend.placement is None
    await backend.close()


async def test_requests_spread_over_both_replicas(
    model: art.TrainableModel, backend_path: Path
) -> None:
    backend = model.backend()
    assert isinstance(backend, RayBackend)
    # Each replica's engine logs under the backend's path, not a temporary directory.
    logs = sorted(p.name for p in (backend_path / "logs").glob("ray-replica-*"))
    assert [name.rsplit("-", 1)[1] for name in logs] == ["0", "1"], logs
    for status in replicas(backend):  # each replica chose and built its engine as LocalBackend
        assert status["engine"] == "transformers"  # this node has no CUDA
        assert status["merged"]  # merge_lora's default (on for a small CPU model) honoured
    before = [status["requests"] for status in replicas(backend)]
    await asyncio.gather(
        *(ask(model, [{"role": "user", "content": f"Count to {i}."}]) for i in range(8))
    )
    after = [status["requests"] for status in replicas(backend)]
    served = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(served) == 8
    assert all(count >= 2 for count in served), served


async def test_a_rollouts_turns_stay_on_one_replica(
    model: art.TrainableModel, tokenizer: Any
) -> None:
    conversations = range(6)

    async def first(k: int) -> list[dict[str, str]]:
        messages = [{"role": "user", "content": f"Conversation {k}: name a color."}]
        # Greedy: a sampled reply may open with a token that merges with the template's
        # newline once re-rendered, and such a turn has no recorded prefix (sticky.py).
        choice = await ask(model, messages, max_tokens=8, temperature=0)
        return [*messages, {"role": "assistant", "content": choice.message.content or ""}]

    histories = await asyncio.gather(*(first(k) for k in conversations))
    await asyncio.gather(
        *(
            ask(model, [*history, {"role": "user", "content": f"Conversation {k}: why?"}])
            for k, history in zip(conversations, histories, strict=True)
        )
    )
    backend = model.backend()
    assert isinstance(backend, RayBackend)
    where: dict[tuple[int, int], int] = {}  # (conversation, turn) -> replica
    for status in replicas(backend):
        for _adapter, prompt_ids in status["served"]:
            text = tokenizer.decode(prompt_ids)
            for k in conversations:
                if f"Conversation {k}: why?" in text:
                    where[k, 2] = status["index"]
                elif f"Conversation {k}: name a color." in text:
                    where[k, 1] = status["index"]
    assert len(where) == 12
    for k in conversations:
        assert where[k, 1] == where[k, 2], f"conversation {k}: {where}"
    assert {where[k, 1] for k in conversations} == {0, 1}  # and conversations spread


async def rollout(model: art.TrainableModel, scenario: str) -> art.Trajectory:
    """The seed's rollout shape: the model's own OpenAI client, a reward, a trajectory."""
    client = model.openai_client()
    messages: art.Messages = [{"role": "user", "content": f"Say the word {scenario}."}]
    completion = await client.chat.completions.create(
        model=model.get_inference_name(), messages=messages, max_tokens=8
    )
    choice = completion.choices[0]
    text = (choice.message.content or "").lower()
    return art.Trajectory(
        messages_and_choices=[*messages, choice], reward=float(scenario in text) + len(text) / 50
    )


async def test_the_seed_training_loop_trains_two_steps_and_both_replicas_serve_each(
    model: art.TrainableModel, backend_path: Path
) -> None:
    backend = model.backend()
    assert isinstance(backend, RayBackend)
    store = ModelStore(str(backend_path), model.project, model.name)
    for _ in range(await model.get_step(), 2):
        train_groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(rollout(model, scenario) for _ in range(4))
                for scenario in ("apple", "river")
            ),
            pbar_desc=None,
        )
        await model.train(train_groups, config=art.TrainConfig(learning_rate=5e-3))
        step = await model.get_step()
        assert store.checkpoint_dir(step).is_dir()
        published = [name for name in replicas(backend)[0]["adapters"] if f"_step{step}_" in name]
        assert len(published) == 1
        for status in replicas(backend):  # loaded everywhere before the next rollouts
            assert published[0] in status["adapters"]
        counts = [
            sum(adapter == published[0] for adapter, _ in status["served"])
            for status in replicas(backend)
        ]
        await asyncio.gather(*(rollout(model, f"word{i}") for i in range(4)))
        served = [
            sum(adapter == published[0] for adapter, _ in status["served"]) - count
            for status, count in zip(replicas(backend), counts, strict=True)
        ]
        assert all(n >= 1 for n in served), served
    assert await model.get_step() == 2
    # One metrics row per step, at the step its rollouts were sampled from.
    assert [row["step"] for row in store.read_history()][-2:] == [0, 1]


async def test_pipeline_trainer_trains_on_ray_whose_replicas_serve_while_it_trains(
    backend: RayBackend, backend_path: Path
) -> None:
    """PipelineTrainer takes RayBackend by the capability it declares, not its type: the
    replicas go on serving while the trainer group trains."""
    model = art.TrainableModel(name="pipelined", project="ray", base_model=BASE)
    await model.register(backend)

    async def group(model: art.TrainableModel, scenario: str, config: None) -> art.TrajectoryGroup:
        return art.TrajectoryGroup([await rollout(model, scenario) for _ in range(3)])

    trainer = PipelineTrainer(
        model,
        backend,
        group,
        ["apple", "river"],
        None,
        num_rollout_workers=2,
        min_batch_size=1,
        max_batch_size=1,
        learning_rate=1e-3,
    )
    await trainer.train()
    assert await model.get_step() >= 1
    rows = ModelStore(str(backend_path), "ray", "pipelined").read_history()
    trained = [row for row in rows if "train/staleness_mean" in row]
    assert trained
    assert max(row["data/step_num_groups_trainable"] for row in trained) > 0


async def test_sft_runs_data_parallel_and_every_replica_serves_its_checkpoint(
    model: art.TrainableModel, backend_path: Path
) -> None:
    """80 examples of an answer format the base never writes, 10 batches each split over
    the two trainer workers: one checkpoint, loaded on both replicas, writes the format."""
    backend = model.backend()
    assert isinstance(backend, RayBackend)
    store = ModelStore(str(backend_path), model.project, model.name)
    before = await model.get_step()
    rng = random.Random(0)
    pairs = [(rng.randint(1, 60), rng.randint(1, 60)) for _ in range(88)]

    def conversation(a: int, b: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"What is {a} plus {b}?"}]

    trajectories = (
        art.Trajectory(
            messages_and_choices=[
                *conversation(a, b),
                {"role": "assistant", "content": f"[[answer: {a + b}]]"},
            ]
        )
        for a, b in pairs[:80]
    )
    await model.train_sft(trajectories, art.TrainSFTConfig(learning_rate=1e-3, batch_size=8))
    step = await model.get_step()
    assert step == before + 1
    published = [name for name in replicas(backend)[0]["adapters"] if f"_step{step}_" in name]
    assert len(published) == 1
    for status in replicas(backend):
        assert published[0] in status["adapters"]
    rows = [row for row in store.read_history() if "sft/loss/train" in row]
    assert len(rows) == 10
    assert all(row["sft/tokens"] > 0 for row in rows)
    answers = await asyncio.gather(
        *(ask(model, conversation(a, b), temperature=0, max_tokens=12) for a, b in pairs[80:])
    )
    written = [(answer.message.content or "").strip() for answer in answers]
    assert sum(bool(re.match(r"^\[\[answer: \d+\]\]$", text)) for text in written) >= 6, written


async def test_two_trainer_workers_make_the_same_update_as_one(
    model: art.TrainableModel, backend_path: Path, tmp_path: Path
) -> None:
    """The tolerance, in float32 (where two sums differ only in their order):
    - the step's gradient (AdamW's first moment, saved in optimizer.pt) within 1e-5 of its
      largest entry, everywhere;
    - the LoRA weights within 1e-6 (a thousandth of the 1e-3 learning rate) in 99.9% of
      entries, and within half an update everywhere: AdamW's first step moves a weight by
      lr * g / (|g| + 1e-8), so where |g| is near 1e-8 rounding shifts that fraction.
    In bfloat16 (the CPU default where it is native) rounding flips a few percent of the
    first step's signs, so the comparison is made in float32.
    """
    from art.backends.ray.placement import RayPlacement

    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(rollout(model, s) for _ in range(4)) for s in ("sun", "moon", "sea")),
        pbar_desc=None,
    )
    start = ModelStore(str(backend_path), model.project, model.name).checkpoint_dir(0)
    config = art.dev.InternalModelConfig(init_args=art.dev.InitArgs(dtype="float32"))
    saved: list[dict[str, torch.Tensor]] = []
    moments: list[list[torch.Tensor]] = []
    all_metrics: list[dict[str, float]] = []
    for workers in (1, 2):
        placement = RayPlacement(RayConfig(replicas=1, trainer_workers=workers))
        try:
            group = placement.start_trainer(
                TrainerSpec(models.resolve(BASE), config, "dp", start, lambda: start)
            )
            all_metrics.append(
                group.step(groups, art.TrainConfig(learning_rate=1e-3), art.dev.TrainConfig())
            )
            group.save(tmp_path / str(workers))
        finally:
            placement.close()
        saved.append(load_file(tmp_path / str(workers) / "adapter_model.safetensors"))
        state = torch.load(tmp_path / str(workers) / "optimizer.pt", weights_only=True)["state"]
        moments.append([state[i]["exp_avg"] for i in sorted(state)])
    before = load_file(start / "adapter_model.safetensors")
    one, two = saved
    assert one.keys() == two.keys() == before.keys()
    moved = max(float((one[k] - before[k]).abs().max()) for k in one)
    assert moved > 1e-4  # the step did update the adapter
    largest = max(float(m.abs().max()) for m in moments[0])
    gradient_gap = max(float((a - b).abs().max()) for a, b in zip(*moments, strict=True))
    assert gradient_gap <= 1e-5 * largest, (gradient_gap, largest)
    gaps = torch.cat([(one[k] - two[k]).abs().flatten() for k in one])
    assert float((gaps <= 1e-6).float().mean()) >= 0.999
    assert float(gaps.max()) <= 0.5e-3
    for name in ("tokens_trained", "sequences_trained"):
        assert all_metrics[0][name] == all_metrics[1][name]
    for name in ("loss", "grad_norm", "entropy"):
        assert all_metrics[1][name] == pytest.approx(all_metrics[0][name], rel=1e-4)


async def test_a_killed_replica_is_routed_around_and_replaced(model: art.TrainableModel) -> None:
    import ray

    backend = model.backend()
    assert isinstance(backend, RayBackend)
    assert backend.placement is not None
    router = backend.placement.routers[0]
    adapters = replicas(backend)[0]["adapters"]
    ray.kill(router.replicas()[0])
    choices = await asyncio.gather(
        *(ask(model, [{"role": "user", "content": f"Spell {i}."}]) for i in range(6))
    )
    assert all(choice.message.content is not None for choice in choices)
    assert any("replica 0 died" in line for line in backend.status()["failures"])
    deadline = time.monotonic() + 300
    while backend.status()["restarts"] < 1:  # a wait for the successor, not a timed assert
        assert time.monotonic() < deadline, backend.status()["failures"]
        await asyncio.sleep(1)
    successor = replicas(backend)[0]
    assert successor["index"] == 0
    assert successor["requests"] == 0
    assert successor["adapters"] == adapters  # caught up before it was routed to
    await asyncio.gather(
        *(ask(model, [{"role": "user", "content": f"Add {i} and 1."}]) for i in range(4))
    )
    assert replicas(backend)[0]["requests"] >= 1


async def test_a_dead_trainer_worker_fails_the_step_and_keeps_the_checkpoint(
    model: art.TrainableModel, backend_path: Path
) -> None:
    import ray

    backend = model.backend()
    assert isinstance(backend, RayBackend)
    assert backend.placement is not None
    store = ModelStore(str(backend_path), model.project, model.name)
    step = await model.get_step()
    checkpoint = store.checkpoint_dir(step)
    files = {path.name: path.read_bytes() for path in checkpoint.iterdir()}
    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(rollout(model, s) for _ in range(4)) for s in ("cat", "dog")),
        pbar_desc=None,
    )
    ray.kill(backend.placement.trainer_groups[0].workers()[1])
    with pytest.raises(art.TrainingError, match="trainer worker 1 of 2 died"):
        await model.train(groups, config=art.TrainConfig(learning_rate=5e-3))
    assert await model.get_step() == step
    assert {path.name: path.read_bytes() for path in checkpoint.iterdir()} == files
    # The next step starts a new group from that checkpoint.
    await model.train(groups, config=art.TrainConfig(learning_rate=5e-3))
    assert await model.get_step() == step + 1


def test_art_serve_ray_refuses_a_bad_config_naming_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from art.cli import main

    code = main(
        ["serve", "--no-auth", "--path", str(tmp_path), "--ray", "--ray-config", '{"replicas": 0}']
    )
    assert code == 2
    assert "--ray-config: replicas:" in capsys.readouterr().err
    code = main(["serve", "--no-auth", "--path", str(tmp_path), "--ray-config", "{}"])
    assert code == 2
    assert "add --ray" in capsys.readouterr().err


async def test_art_serve_ray_trains_the_same_script_through_serverless_backend(
    tmp_path: Path,
) -> None:
    """`art serve --ray` (its own local cluster) behind ServerlessBackend, unchanged."""
    from serve_server import KEY, Server
    from test_serve import train_one_step

    from art.serverless.backend import ServerlessBackend

    config = '{"replicas": 1, "trainer_workers": 1}'
    server = Server(tmp_path / ".art", "--ray", "--ray-config", config)
    try:
        result = await train_one_step(ServerlessBackend(base_url=server.url, api_key=KEY))
    finally:
        server.stop()
    assert "Started a local Ray instance" in server.log()  # the service ran on Ray
    assert result["steps"] == (0, 1)
    assert result["served"] == result["names"]
    checkpoint = tmp_path / ".art" / "serve" / "models" / "script" / "checkpoints" / "0001"
    assert (checkpoint / "adapter_model.safetensors").is_file()
