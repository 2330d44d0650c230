"""`art run`'s S3 routes (ART's `/_experimental_push_to_s3` and `/_experimental_pull_from_s3`)
driven by the third-party client of ART's protocol, against the session's real
S3-compatible server on 127.0.0.1 (moto's server mode, `s3_server`).

Each `art run` app is served by uvicorn on 127.0.0.1 in a thread of this process, so it
sees the AWS settings the `s3_bucket` fixture sets. No model is loaded: the model's
directory on the first server is written by hand, as a LocalBackend writes it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from art_protocol_client import ThirdPartyBackend

import art
from art.core.store.model_store import ModelStore
from art.serve.art_run import build_run_app

KEY = "run-s3-key"


@pytest.fixture
def run_server() -> Iterator[object]:
    """Starts `art run` apps on free ports; each is stopped after the test."""
    servers: list[uvicorn.Server] = []

    def start(path: Path) -> str:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        app = build_run_app(str(path), KEY)
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        server = uvicorn.Server(config)
        threading.Thread(target=server.run, daemon=True).start()
        servers.append(server)
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "art run did not start"
            time.sleep(0.02)
        return f"http://127.0.0.1:{port}"

    yield start
    for server in servers:
        server.should_exit = True


def write_model(path: Path, project: str, steps: tuple[int, ...]) -> ModelStore:
    store = ModelStore(path, project, "agent")
    store.write_model({"name": "agent", "project": project, "base_model": "b", "trainable": True})
    for step in steps:
        checkpoint = store.checkpoint_dir(step)
        checkpoint.mkdir(parents=True)
        (checkpoint / "adapter_config.json").write_text(json.dumps({"step": step}))
        (checkpoint / "adapter_model.safetensors").write_bytes(os.urandom(1024))
        store.append_history(step, {"reward": 0.5})
    return store


async def test_a_model_pushed_by_one_art_run_is_pulled_by_another(
    run_server: object, s3_bucket: str, unique_project: str, tmp_path: Path
) -> None:
    start = run_server
    assert callable(start)
    stored = write_model(tmp_path / "one", unique_project, steps=(1, 2))
    model = art.TrainableModel(name="agent", project=unique_project, base_model="b")
    one = ThirdPartyBackend(start(tmp_path / "one"), KEY)
    two = ThirdPartyBackend(start(tmp_path / "two"), KEY)
    try:
        await one._experimental_push_to_s3(model, s3_bucket=s3_bucket, prefix="runs")
        import boto3

        listed = boto3.session.Session().client("s3").list_objects_v2(Bucket=s3_bucket)
        names = sorted(item["Key"] for item in listed["Contents"])
        root = f"runs/{unique_project}/models/agent/"
        assert root + "checkpoints/0002/adapter_model.safetensors" in names
        assert root + ".art-complete/0002.json" in names  # published, as LocalBackend's push

        await two._experimental_pull_from_s3(model, s3_bucket=s3_bucket, prefix="runs")
        pulled = ModelStore(tmp_path / "two", unique_project, "agent")
        assert pulled.checkpoint_steps() == [1, 2]
        weights = "adapter_model.safetensors"
        assert (pulled.checkpoint_dir(2) / weights).read_bytes() == (
            stored.checkpoint_dir(2) / weights
        ).read_bytes()
        assert await two._get_step(model) == 2

        # What is missing is a 404 naming it; a bad field a 400 naming it.
        with pytest.raises(httpx.HTTPStatusError) as missing:
            await two._experimental_pull_from_s3(model, s3_bucket="art-no-such-bucket")
        answer = missing.value.response
        assert answer.status_code == 404
        assert answer.json()["error"]["param"] == "s3_bucket"
        assert "'art-no-such-bucket' does not exist" in answer.json()["error"]["message"]
        nobody = art.TrainableModel(name="nobody", project=unique_project, base_model="b")
        with pytest.raises(httpx.HTTPStatusError) as nothing:
            await two._experimental_push_to_s3(nobody, s3_bucket=s3_bucket)
        assert (
            nothing.value.response.status_code,
            nothing.value.response.json()["error"]["param"],
        ) == (
            404,
            "model",
        )
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}) as raw:
            url = f"{one._client.base_url}/_experimental_push_to_s3"
            for body, param in (
                ({"model": model.model_dump(), "delete": "yes"}, "delete"),
                ({"model": model.model_dump(), "s3_bucket": 7}, "s3_bucket"),
                ({"model": model.model_dump(), "only_step": 1}, "only_step"),
                ({"s3_bucket": s3_bucket}, "model"),
            ):
                refused = await raw.post(url, json=body)
                assert refused.status_code == 400, body
                assert refused.json()["error"]["param"] == param
            unkeyed = await raw.post(
                url, json={"model": model.model_dump()}, headers={"Authorization": ""}
            )
            assert unkeyed.status_code == 401
    finally:
        await one.close()
        await two.close()
