"""`art run` driven by a third-party client of ART's backend protocol, in another process.

`art_protocol_client.ThirdPartyBackend` is written the way an outside integration writes
one (its own httpx client, ART's private method names); our `TrainableModel` drives it by
ART's protocol. The client rebuilds each Choice from its index, message, logprobs and
finish reason, as such clients do, so the sampled ids survive only in the logprobs.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from art_protocol_client import ThirdPartyBackend
from helpers import one_at_a_time
from openai.types.chat.chat_completion import Choice

import art

pytestmark = pytest.mark.model  # art run loads the default model

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
KEY = "run-key-123"
PROMPT = [{"role": "user", "content": "Name a colour."}]


class RunServer:
    def __init__(self, path: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.root = f"http://127.0.0.1:{self.port}"
        self.path = path
        self.log_path = path.parent / f"run-{self.port}.log"
        self._log = self.log_path.open("w")
        command = [sys.executable, "-m", "art", "run", "--port", str(self.port)]
        command += ["--path", str(path), "--api-key", KEY]
        self.process = subprocess.Popen(command, stderr=self._log)
        deadline = time.monotonic() + 120
        while True:
            assert self.process.poll() is None, self.log_path.read_text()
            try:
                if httpx.get(f"{self.root}/healthcheck").json() == {"status": "ok"}:
                    return
            except httpx.TransportError:
                assert time.monotonic() < deadline, "art run did not start"
                time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        self._log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunServer]:
    running = RunServer(tmp_path_factory.mktemp("art-run") / "server")
    yield running
    running.stop()


def rebuilt(choice: Choice) -> Choice:
    """The Choice as a client that keeps only OpenAI's own fields has it."""
    return Choice(
        index=choice.index,
        logprobs=choice.logprobs,
        message=choice.message,
        finish_reason=choice.finish_reason,
    )


def completion_logprob(default_model: tuple[Any, Any], checkpoint: Path, choice: Choice) -> float:
    """The completion's total logprob given its prompt under the adapter in `checkpoint`."""
    from peft import PeftModel

    base, _ = default_model
    scorer = PeftModel.from_pretrained(copy.deepcopy(base), str(checkpoint))
    extra = choice.model_extra or {}
    prompt, tokens = extra["prompt_token_ids"], extra["token_ids"]
    with torch.no_grad():
        logits = scorer(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        picked = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(tokens)[:, None])
    return float(picked.sum())


async def test_a_third_party_backend_registers_samples_trains_deletes_and_resumes(
    server: RunServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    default_model: tuple[Any, Any],
) -> None:
    monkeypatch.chdir(tmp_path)  # the client logs under ./.art, as ART's model does
    backend = ThirdPartyBackend(server.root, KEY)
    model = art.TrainableModel(name="agent", project="remote", base_model=BASE)
    await model.register(backend)
    assert model.backend() is backend
    assert model.inference_base_url == f"{server.root}/v1"
    assert model.get_inference_name() == "agent"  # ART's fallback: no _model_inference_name
    assert await model.get_step() == 0

    client = model.openai_client()
    sampled = []
    for _ in range(4):
        completion = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=PROMPT,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=1.0,
            logprobs=True,
        )
        sampled.append(completion.choices[0])
    for choice in sampled:  # ART's vLLM writes the sampled ids into the logprob tokens
        assert choice.logprobs is not None
        assert choice.logprobs.content is not None
        tokens = [entry.token for entry in choice.logprobs.content]
        assert tokens == [f"token_id:{i}" for i in (choice.model_extra or {})["token_ids"]]

    rewarded = max(range(4), key=lambda i: len((sampled[i].model_extra or {})["token_ids"]))
    group = art.TrajectoryGroup(
        art.Trajectory(
            messages_and_choices=[*PROMPT, rebuilt(choice)], reward=1.0 if i == rewarded else 0.0
        )
        for i, choice in enumerate(sampled)
    )
    assert all(not (t.messages_and_choices[-1].model_extra or {}) for t in group.trajectories)  # type: ignore[union-attr]
    for _ in range(2):
        await model.train([group], config=art.TrainConfig(learning_rate=1e-3))
    assert await model.get_step() == 2

    checkpoints = server.path / "remote" / "models" / "agent" / "checkpoints"
    before = completion_logprob(default_model, checkpoints / "0000", sampled[rewarded])
    after = completion_logprob(default_model, checkpoints / "0002", sampled[rewarded])
    assert after > before, (before, after)  # the rewarded completion's logprob rose

    # The client logged both steps, as ART's model does on its side of the protocol.
    history = tmp_path / ".art" / "remote" / "models" / "agent" / "history.jsonl"
    rows = [json.loads(line) for line in history.read_text().splitlines()]
    assert [row["step"] for row in rows if "loss/train" in row] == [0, 1]  # as LocalBackend logs

    await model.delete_checkpoints()  # no val/reward yet: only the latest is kept
    assert sorted(p.name for p in checkpoints.iterdir()) == ["0002"]
    await backend.close()

    # A new process resumes: it registers again, finds step 2 and trains step 3.
    script = tmp_path / "resume.py"
    script.write_text(RESUME)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), ROOT])}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(script), server.root, KEY, json.dumps(group.model_dump(mode="json"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["2", "3"]


ROOT = str(Path(__file__).parents[2])
RESUME = f"""
import asyncio, sys
import art
from art_protocol_client import ThirdPartyBackend

async def main() -> None:
    backend = ThirdPartyBackend(sys.argv[1], sys.argv[2])
    model = art.TrainableModel(name="agent", project="remote", base_model={BASE!r})
    await model.register(backend)
    print(await model.get_step())
    group = art.TrajectoryGroup.model_validate_json(sys.argv[3])
    await model.train([group], config=art.TrainConfig(learning_rate=1e-3))
    print(await model.get_step())
    await backend.close()

asyncio.run(main())
"""


# ART 0.5.17 in a venv of its own, with what its model needs beside its declared
# requirements (pyarrow and numpy for its logs) and the OpenAI SDK of its time (3.x moved
# to httpx2, which its client's httpx timeout breaks). Built once per machine.
ART_017 = ["openpipe-art==0.5.17", "openai==2.54.0", "pyarrow==26.0.1", "numpy==2.4.6"]
ART_017_CLIENT = f"""
import asyncio, sys
import art  # ART 0.5.17's own
from art_protocol_client import ThirdPartyBackend

async def main() -> None:
    backend = ThirdPartyBackend(sys.argv[1], sys.argv[2])
    model = art.TrainableModel(name="agent17", project="remote", base_model={BASE!r})
    await model.register(backend)
    print(await model.get_step())
    client = model.openai_client()
    trajectories = []
    for reward in (0.0, 1.0):
        completion = await client.chat.completions.create(
            model=model.get_inference_name(), messages={PROMPT!r}, max_tokens=8, logprobs=True
        )
        messages = [*{PROMPT!r}, completion.choices[0]]
        trajectories.append(art.Trajectory(messages_and_choices=messages, reward=reward))
    await model.train([art.TrajectoryGroup(trajectories)], config=art.TrainConfig(learning_rate=1e-4))
    print(await model.get_step())
    await backend.close()

asyncio.run(main())
"""


def art_017_python() -> Path:
    """The interpreter of a venv holding ART 0.5.17; skips the test where pip cannot get it."""
    cache = Path(os.environ.get("ART_VENV_CACHE", Path.home() / ".cache" / "art" / "venvs"))
    venv = cache / f"openpipe-art-0.5.17-py{sys.version_info.major}{sys.version_info.minor}"
    python = venv / "bin" / "python"
    with one_at_a_time("art-0.5.17-venv"):
        if python.exists():
            return python
        building = venv.with_name(venv.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(building)], check=True)
        pip = [str(building / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
        installed = subprocess.run([*pip, *ART_017], capture_output=True, text=True)
        if installed.returncode != 0:
            shutil.rmtree(building, ignore_errors=True)
            pytest.skip(f"pip could not install ART 0.5.17 here: {installed.stderr[-500:]}")
        building.rename(venv)  # a venv's scripts name their path: only `python -m` is used
        return python


async def test_art_0_5_17s_own_model_drives_art_run(server: RunServer, tmp_path: Path) -> None:
    python = await asyncio.to_thread(art_017_python)
    script = tmp_path / "art017_client.py"
    script.write_text(ART_017_CLIENT)
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).parent),  # the client class, and no art of ours
        "WEAVE_DISABLED": "true",
        "WANDB_MODE": "offline",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    done = await asyncio.to_thread(
        subprocess.run,
        [str(python), str(script), server.root, KEY],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0", "1"]
    assert (server.path / "remote" / "models" / "agent17" / "checkpoints" / "0001").is_dir()
    # ART's model logged the step on its side, under its base_path (./.art).
    assert (tmp_path / ".art" / "remote" / "models" / "agent17" / "history.jsonl").exists()


async def test_every_route_refuses_bad_input_with_a_4xx_naming_the_field(
    server: RunServer,
) -> None:
    model = {"name": "agent", "project": "remote", "base_model": BASE, "trainable": True}
    group = {"trajectories": [{"messages_and_choices": PROMPT, "reward": 1.0}]}
    cases: list[tuple[str, Any, str]] = [
        ("/register", {"project": "remote"}, "name"),
        ("/register", {**model, "name": "bad name"}, "name"),
        ("/register", {**model, "color": "red"}, "color"),
        (
            "/register",
            {**model, "_internal_config": {"engine_args": {"bogus": 1}}},
            "engine_args.bogus",
        ),
        ("/register", [1], "body"),
        ("/_get_step", "not a model", "body"),
        (
            "/_prepare_backend_for_training",
            {"model": model, "config": {"log_file": "x"}},
            "config.log_file",
        ),
        (
            "/_prepare_backend_for_training",
            {"model": model, "config": {"server_args": {"tool_call_parser": "hermes"}}},
            "config.server_args.tool_call_parser",
        ),
        (
            "/_prepare_backend_for_training",
            {"model": model, "config": {"server_args": {"port": 70000}}},
            "config.server_args.port",
        ),
        (
            "/_prepare_backend_for_training",
            {"model": model, "config": {"server_args": {"api_key": "other"}}},
            "config.server_args.api_key",
        ),
        (
            "/_prepare_backend_for_training",
            {"model": {"name": "agent", "project": "remote"}},
            "model.trainable",
        ),
        ("/_train_model", {"model": model, "trajectory_groups": "x"}, "trajectory_groups"),
        ("/_train_model", {"model": model, "trajectory_groups": [1]}, "trajectory_groups[0]"),
        (
            "/_train_model",
            {"model": model, "trajectory_groups": [group], "config": {"learning_rate": -1}},
            "config.learning_rate",
        ),
        (
            "/_train_model",
            {"model": model, "trajectory_groups": [group], "dev_config": {"nope": 1}},
            "dev_config.nope",
        ),
        (
            "/_train_model",
            {"model": model, "trajectory_groups": [group], "verbose": "yes"},
            "verbose",
        ),
        ("/_train_model", {"model": model, "trajectory_groups": [group], "extra": 1}, "extra"),
        ("/_train_model", {"trajectory_groups": [group]}, "model"),
        ("/_delete_checkpoint_files", {"model": model, "steps_to_keep": "1"}, "steps_to_keep"),
    ]
    headers = {"Authorization": f"Bearer {KEY}"}
    failures = []
    async with httpx.AsyncClient(base_url=server.root, headers=headers, timeout=300) as http:
        for path, body, param in cases:
            response = await http.post(path, json=body)
            error = response.json().get("error", {}) if response.status_code < 500 else {}
            if not (400 <= response.status_code < 500 and error.get("param") == param):
                failures.append((path, body, param, response.status_code, response.text[:300]))
        bad_json = await http.post(
            "/register", content=b"{", headers={"content-type": "application/json"}
        )
        assert (bad_json.status_code, bad_json.json()["error"]["param"]) == (400, "body")
        # The training route refuses groups with nothing the model sampled, before training.
        untrainable = await http.post(
            "/_train_model", json={"model": model, "trajectory_groups": [group]}
        )
        assert untrainable.status_code == 400, untrainable.text
        assert untrainable.json()["error"]["param"] == "trajectory_groups"
    assert failures == []
    async with httpx.AsyncClient(base_url=server.root, timeout=300) as anonymous:
        for path in ("/register", "/_get_step", "/close"):
            denied = await anonymous.post(path, json=model)
            assert denied.status_code == 401, (path, denied.text)
            assert denied.json()["error"]["param"] == "Authorization"
        assert (await anonymous.get("/v1/models")).status_code == 401
        assert (await anonymous.get("/healthcheck")).json() == {"status": "ok"}


async def test_server_args_port_and_host_are_honoured_with_another_listener(
    server: RunServer,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = {"name": "listener", "project": "remote", "base_model": BASE, "trainable": True}
    config = {"server_args": {"host": "127.0.0.1", "port": port, "api_key": KEY}}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=server.root, headers=headers, timeout=300) as http:
        answer = await http.post(
            "/_prepare_backend_for_training", json={"model": model, "config": config}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json() == [f"http://127.0.0.1:{port}/v1", KEY]
        chat = {"model": "remote/listener", "messages": PROMPT, "max_tokens": 2, "logprobs": True}
        sampled = await http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=chat)
        assert sampled.status_code == 200, sampled.text
        token = sampled.json()["choices"][0]["logprobs"]["content"][0]["token"]
        assert token.startswith("token_id:")
    async with httpx.AsyncClient(timeout=300) as anonymous:
        denied = await anonymous.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=chat)
        assert denied.status_code == 401  # the listener keeps art run's key


async def test_a_model_this_process_never_registered_trains_on_its_first_call(
    server: RunServer,
) -> None:
    # A client that registered before art run restarted goes straight to training.
    model = {"name": "unseen", "project": "remote", "base_model": BASE, "trainable": True}
    group = {
        "trajectories": [
            {
                "messages_and_choices": [*PROMPT, {"role": "assistant", "content": colour}],
                "reward": reward,
            }
            for colour, reward in (("Blue.", 1.0), ("Red.", 0.0))
        ]
    }
    body = {
        "model": model,
        "trajectory_groups": [group],
        "dev_config": {"allow_training_without_logprobs": True},
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=server.root, headers=headers, timeout=300) as http:
        trained = await http.post("/_train_model", json=body)
        assert trained.status_code == 200, trained.text
        assert "loss/train" in json.loads(trained.text.splitlines()[0])
        assert (await http.post("/_get_step", json=model)).json() == 1
