"""`art serve` in a subprocess, `ServerlessBackend` as its client, and `SkyPilotBackend`'s task.

Every server here is a real `python -m art serve` on 127.0.0.1 with the real default
model; one serves most of the module, one more is killed and restarted.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_server import BASE, KEY, Server

import art
from art.backends.skypilot import cluster_task, read_env_file
from art.cli import main as cli_main
from art.local import LocalBackend
from art.serverless.backend import ServerlessBackend
from art.skypilot import SkyPilotBackend

pytestmark = pytest.mark.model  # loads the default model or starts a model service


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("serve") / ".art", "--max-body-mb", "1")
    yield running
    running.stop()


async def train_one_step(backend: Any) -> dict[str, Any]:
    """The user's training script: nothing in it depends on which backend it is given."""
    model = art.TrainableModel(name="script", project="serve", base_model=BASE)
    await model.register(backend)
    client = model.openai_client()

    async def rollout(word: str, index: int) -> art.Trajectory:
        trajectory = art.Trajectory(
            messages_and_choices=[{"role": "user", "content": f"Repeat the word {word}."}]
        )
        completion = await client.chat.completions.create(
            model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=6
        )
        trajectory.messages_and_choices.append(completion.choices[0])
        trajectory.reward = float(index)
        return trajectory

    before = await model.get_step()
    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(rollout(w, i) for i in range(3)) for w in ("apple", "river")),
        pbar_desc=None,
    )
    await model.train(groups, config=art.TrainConfig(learning_rate=1e-3))
    after = await model.get_step()
    await model.log(groups, split="val")
    deleted = await model.delete_checkpoints("val/reward")
    served = await client.models.list()
    await backend.close()
    return {
        "steps": (before, after),
        "deleted": deleted,
        "served": sorted(m.id for m in served.data if "script" in m.id),
        "names": sorted([model.get_inference_name(), model.get_inference_name(1)]),
    }


def checkpoints(root: Path, project: str, name: str) -> list[str]:
    directory = root / project / "models" / name / "checkpoints"
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


@pytest.mark.parametrize("kind", ["serve", "local-in-process", "local-child"])
async def test_the_same_script_trains_one_step_on_every_backend(
    kind: str, server: Server, tmp_path: Path
) -> None:
    if kind == "serve":
        backend: Any = ServerlessBackend(base_url=server.url, api_key=KEY)
        root = server.path
    else:
        root = tmp_path / ".art"
        backend = LocalBackend(path=root, in_process=kind == "local-in-process")

    result = await train_one_step(backend)

    assert result["steps"] == (0, 1)
    assert result["deleted"] == [0]  # step 1 is both the latest and the best
    if kind == "serve":  # the W&B Training API's names, which say the project
        assert (
            result["served"]
            == result["names"]
            == [
                "wandb-artifact:///local/serve/script",
                "wandb-artifact:///local/serve/script:step1",
            ]
        )
    else:  # `project/name`, and the bare name while no other project has one like it
        assert result["names"] == ["serve/script", "serve/script@1"]
        assert result["served"] == ["script", "script@1", "serve/script", "serve/script@1"]
    assert checkpoints(root, "serve", "script") == ["0001"]
    run = root / "serve" / "models" / "script"
    assert (run / "checkpoints" / "0001" / "adapter_model.safetensors").is_file()
    assert (run / "trajectories" / "train" / "0000.parquet").is_file()
    assert (run / "trajectories" / "val" / "0001.parquet").is_file()
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert "loss/train" in rows[0]
    assert rows[-1]["val/reward"] == 1.0


async def test_a_training_job_reports_events_a_client_can_resume_after(server: Server) -> None:
    """The event feed is numbered: asking again `after` the last id seen misses nothing."""
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as http:

        async def jobs() -> list[dict[str, Any]]:
            params = {"model_id": "serve~script"}
            listed: list[dict[str, Any]] = (
                await http.get("/preview/training-jobs", params=params)
            ).json()["data"]
            return listed

        if not await jobs():  # run alone, not after the script test: train the step here
            await train_one_step(ServerlessBackend(base_url=server.url, api_key=KEY))
        job = (await jobs())[0]["id"]
        everything = (await http.get(f"/preview/training-jobs/{job}/events")).json()
        rest = (await http.get(f"/preview/training-jobs/{job}/events?after=2")).json()
    types = [event["type"] for event in everything["data"]]
    assert types == ["training_started", "gradient_step", "training_ended"]
    assert [event["id"] for event in everything["data"]] == ["1", "2", "3"]
    assert everything["has_more"] is False
    assert rest["data"] == everything["data"][2:]
    started, gradient, ended = (event["data"] for event in everything["data"])
    assert started == {"num_sequences": 6}  # 2 groups of 3 rollouts
    # ART's client reads a gradient step's data as float metrics.
    assert "loss" in gradient
    assert all(isinstance(value, float) for value in gradient.values())
    assert ended["step"] == 1
    assert everything["status"] == "succeeded"
    log = server.log()  # the job's start and end, on the server's stderr at info level
    assert f"INFO:     art.serve: training job {job} of model serve~script started" in log
    assert f"training job {job} of model serve~script finished: step 1" in log


async def test_serve_logs_what_it_did_and_stops_cleanly_on_ctrl_c(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    running = Server(tmp_path / ".art")
    try:
        await art.Model(name="plain", project="logs").register(
            ServerlessBackend(base_url=running.url, api_key=KEY)
        )
        async with httpx.AsyncClient(base_url=running.url, timeout=60) as http:
            deleted = await http.delete(
                "/preview/models/logs~plain", headers={"Authorization": f"Bearer {KEY}"}
            )
        assert deleted.status_code == 200
    finally:
        running.stop(signal.SIGINT)  # what Ctrl-C sends
    assert running.process.returncode == 0
    log = running.log()
    assert "INFO:     art.serve: model logs~plain registered (not trainable)" in log
    assert "INFO:     art.serve: model logs~plain deleted" in log
    assert "Traceback" not in log
    with pytest.raises(SystemExit):
        cli_main(["serve", "--help"])
    assert "Ctrl-C" in capsys.readouterr().out


async def test_requests_without_the_key_or_too_big_or_malformed_are_refused(
    server: Server,
) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        good = {"Authorization": f"Bearer {KEY}"}
        assert (await http.get("/preview/models/serve~script")).status_code == 401
        wrong = {"Authorization": "Bearer not-the-key"}
        assert (await http.get("/preview/models/serve~script", headers=wrong)).status_code == 401
        assert (await http.get("/models", headers=wrong)).status_code == 401

        too_big = await http.post(
            "/preview/models/serve~script/log",
            headers=good,
            content=b"x" * (2 * 2**20),
        )
        assert too_big.status_code == 413
        assert "limit" in too_big.json()["error"]["message"]

        not_json = await http.post("/preview/models", headers=good, content=b"{not json")
        assert not_json.status_code == 400
        escaping = await http.post(
            "/preview/models", headers=good, json={"project": "../etc", "name": "x"}
        )
        assert escaping.status_code == 400
        assert escaping.json()["error"]["param"] == "project"
        bad_log = await http.post(
            "/preview/models/serve~script/log",
            headers=good,
            json={"trajectory_groups": [{"trajectories": "nope"}]},
        )
        assert bad_log.status_code == 400
        assert bad_log.json()["error"]["param"].startswith("trajectory_groups[0]")
        bad_split = await http.post(
            "/preview/models/serve~script/log", headers=good, json={"split": "../x"}
        )
        assert bad_split.status_code == 400
        assert bad_split.json()["error"]["param"] == "split"

        # Still serving, health without a key, the rest with it.
        assert (await http.get(f"http://127.0.0.1:{server.port}/health")).status_code == 200
        model = await http.get("/preview/models/serve~script", headers=good)
        assert model.status_code == 200
        assert model.json()["step"] == 1


async def test_client_errors_name_the_problem(server: Server, monkeypatch: Any) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(art.ConfigError, match="WANDB_API_KEY"):
        ServerlessBackend(base_url=server.url)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    backend = ServerlessBackend(base_url=dead, api_key=KEY, max_retries=1)
    with pytest.raises(art.BackendError, match=f"cannot reach the art server at {dead}"):
        await art.Model(name="m", project="p").register(backend)

    wrong = ServerlessBackend(base_url=server.url, api_key="wrong")
    with pytest.raises(art.BackendError, match="refused the API key"):
        await art.Model(name="m", project="p").register(wrong)
    await wrong.close()

    # The server's checks come back as the same errors LocalBackend raises.
    other = ServerlessBackend(base_url=server.url, api_key=KEY)
    clash = art.TrainableModel(name="script", project="serve", base_model="other/base")
    with pytest.raises(art.ConfigError, match="base_model") as raised:
        await clash.register(other)
    assert raised.value.field == "base_model"
    await other.close()


async def test_a_killed_server_fails_the_client_and_restarts_at_the_last_step(
    tmp_path: Path,
) -> None:
    root = tmp_path / ".art"
    first = Server(root)
    backend = ServerlessBackend(base_url=first.url, api_key=KEY, max_retries=2)
    model = art.TrainableModel(name="crash", project="serve", base_model=BASE)
    await model.register(backend)
    client = model.openai_client()

    async def rollout(index: int) -> art.Trajectory:
        messages: list[Any] = [{"role": "user", "content": "Name a colour."}]
        completion = await client.chat.completions.create(
            model=model.name, messages=messages, max_tokens=12
        )
        return art.Trajectory(
            messages_and_choices=[*messages, completion.choices[0]], reward=float(index)
        )

    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout(i) for i in range(6))], pbar_desc=None
    )
    await model.train(groups)
    assert await model.get_step() == 1

    training = asyncio.create_task(model.train(groups))
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}) as http:
        while True:  # kill it once the second step is under way
            jobs = (await http.get(f"{first.url}/preview/training-jobs")).json()["data"]
            if len(jobs) == 2 and jobs[1]["status"] == "running":
                break
            await asyncio.sleep(0.01)
    first.stop(signal.SIGKILL)
    with pytest.raises(art.BackendError, match=rf"lost training job .* on {first.url}"):
        await training
    await backend.close()

    second = Server(root)
    try:
        again = ServerlessBackend(base_url=second.url, api_key=KEY)
        resumed = art.TrainableModel(name="crash", project="serve", base_model=BASE)
        await resumed.register(again)
        step = await resumed.get_step()
        assert step in (1, 2)  # 2 only if the kill came after the checkpoint's rename
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}) as http:
            listed = await http.get(f"{second.url}/preview/training-jobs?model_id=serve~crash")
        statuses = [job["status"] for job in listed.json()["data"]]
        assert statuses[0] == "succeeded"
        if step == 1:  # the restarted server says the cut-off job failed
            assert statuses == ["succeeded", "failed"]
        steps = checkpoints(root, "serve", "crash")
        assert steps == [f"{s:04d}" for s in range(step + 1)]
        saved = root / "serve" / "models" / "crash" / "checkpoints"
        for name in steps:
            assert (saved / name / "adapter_model.safetensors").is_file()
        completion = await resumed.openai_client().chat.completions.create(
            model=resumed.get_inference_name(),
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
        )
        assert completion.choices[0].message.content is not None
        await again.close()
    finally:
        second.stop()


def test_serve_refuses_to_start_without_a_key_unless_on_loopback_with_no_auth(
    capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.delenv("ART_API_KEY", raising=False)
    assert cli_main(["serve", "--port", "1"]) == 2
    assert "--api-key" in capsys.readouterr().err
    assert cli_main(["serve", "--no-auth", "--host", "0.0.0.0", "--port", "1"]) == 2
    assert "loopback" in capsys.readouterr().err


def test_skypilot_task_installs_art_and_serves_with_a_key_from_the_environment(
    tmp_path: Path,
) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("# secrets\nWANDB_API_KEY=abc\nexport HF_TOKEN='xyz'\n")
    task = cluster_task(
        api_key="generated",
        gpu="H100",
        resources={"cloud": "runpod"},
        art_version="0.3.1",
        envs=read_env_file(env_file),
        port=7999,
    )
    assert task["resources"] == {"ports": [7999], "accelerators": "H100", "cloud": "runpod"}
    assert task["envs"] == {"WANDB_API_KEY": "abc", "HF_TOKEN": "xyz", "ART_API_KEY": "generated"}
    assert "'art-grpo[backend]==0.3.1'" in task["setup"]
    assert task["run"] == "art serve --host 0.0.0.0 --port 7999 --path ~/.art"
    assert "generated" not in task["run"]  # the key stays out of the process list
    git = cluster_task(api_key="k", art_version="git+https://example.com/art.git")
    assert "git+https://example.com/art.git" in git["setup"]


def test_a_multi_node_skypilot_task_forms_a_ray_cluster_and_serves_on_it() -> None:
    task = cluster_task(
        api_key="generated",
        art_version="0.3.1",
        port=7999,
        num_nodes=3,
        ray_config={"replicas": 4, "trainer_workers": 2},
    )
    assert task["num_nodes"] == 3
    assert "'art-grpo[backend,ray]==0.3.1'" in task["setup"]
    run = task["run"]
    # Every node runs the script: the first starts Ray's head, the others join it.
    assert 'exec ray start --address="$head:6379" --block' in run
    assert "ray start --head --port=6379" in run
    assert 'int(os.environ["SKYPILOT_NUM_NODES"])' in run  # the head waits for every node
    assert run.rstrip().endswith(
        "art serve --host 0.0.0.0 --port 7999 --path ~/.art --ray --ray-config "
        """'{"address": "auto", "replicas": 4, "trainer_workers": 2}'"""
    )
    assert "generated" not in run
    with pytest.raises(art.ConfigError, match="num_nodes"):
        cluster_task(api_key="k", num_nodes=0)
    with pytest.raises(art.ConfigError, match="ray_config"):
        cluster_task(api_key="k", ray_config={"replicas": 2})
    with pytest.raises(art.ConfigError, match=r"ray_config.*replicas"):
        cluster_task(api_key="k", num_nodes=2, ray_config={"replicas": 0})


@pytest.mark.skipif(importlib.util.find_spec("sky") is not None, reason="SkyPilot is installed")
async def test_skypilot_without_the_sdk_says_what_to_install() -> None:
    with pytest.raises(art.BackendError, match=r"pip install 'art-grpo\[skypilot\]'.*sky check"):
        await SkyPilotBackend.initialize_cluster(cluster_name="c", gpu="H100")
