"""The vLLM engine on a server you run: ART 0.5.23's `vllm_runtime.mode='external'`.

The trainer runs here; every rollout is sampled by your vLLM server, through the same
token-in, token-out path as the engine this backend starts (`engine.VLLMEngine`), so the
endpoint, its four protocols and the exact token ids the trainer needs are unchanged.
Each checkpoint reaches the server as a LoRA adapter over HTTP (`/v1/load_lora_adapter`),
under a name that starts with this engine's own prefix, so two backends sharing a server
never meet; closing the engine unloads them. The server is attached to, never started or
stopped: when it stops answering, requests fail with `EngineUnavailable` naming
`server_url`, and once its `/health` answers again the engine reloads its adapters.

What the server must have been started with, each checked when the engine starts (a
`ConfigError` naming `_internal_config.vllm_runtime.server_url` and the flag otherwise):
`--enable-lora` with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` in its environment (runtime
adapter loading), `--enable-scale-out` (the `/inference/v1/generate` API) and a
`--max-model-len` at least the model's context here (`engine_args.max_model_len` lowers
ours). `--max-lora-rank` below `peft_args.r` fails the first adapter load, with the
server's message.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from ....core.data import dev
from ....core.data.errors import ConfigError
from ..base import AdapterGone, EngineSpec, OnToken, Sample, SamplingParams
from ..structured import Grammars
from .engine import VLLMEngine

logger = logging.getLogger("art.service")

_FIELD = "_internal_config.vllm_runtime.server_url"
_LAUNCH_HINT = (
    "Start it as `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve <base model> "
    "--enable-lora --max-lora-rank <r> --enable-scale-out`"
)
# engine_args fields that say how to launch vLLM: the server was launched already.
_LAUNCH_FIELDS = ("max_num_seqs", "gpu_memory_utilization", "enforce_eager")


class ExternalServer:
    """A vLLM server someone else runs, as `VLLMEngine`'s server: waited for, probed for
    what the engine needs, never started or stopped."""

    def __init__(self, runtime: dev.VllmRuntime, context_length: int) -> None:
        assert runtime.server_url is not None  # VllmRuntime requires it in external mode
        self.runtime = runtime
        self.url = runtime.server_url
        self.base_url = dev.vllm_server_url(runtime.server_url)
        self.api_key = runtime.api_key or "EMPTY"  # vLLM without --api-key ignores it
        self.log_path = f"the server's own, at {self.base_url}"  # named in errors
        self.context_length = context_length
        self._served_name: str | None = None

    @property
    def served_name(self) -> str:
        assert self._served_name is not None, "start() first"
        return self._served_name

    def start(self) -> None:
        """Wait for `/health`, then check what the engine needs of the server."""
        deadline = time.monotonic() + self.runtime.health_timeout_s
        while not self._healthy():
            if time.monotonic() > deadline:
                raise ConfigError(
                    _FIELD,
                    f"{self.url!r}: no vLLM server answered {self.base_url}/health within "
                    f"{self.runtime.health_timeout_s:.0f} s",
                    f"Start your vLLM server there, or fix server_url. {_LAUNCH_HINT}",
                )
            time.sleep(0.5)
        self._served_name = self._base_model()
        self._require_route(
            "/v1/unload_lora_adapter",
            {"lora_name": f"art-probe-{secrets.token_hex(4)}"},
            "has no runtime LoRA loading (/v1/load_lora_adapter)",
        )
        self._require_route(
            "/inference/v1/generate",
            {},
            "has no token-in, token-out API (/inference/v1/generate, --enable-scale-out)",
        )

    def _healthy(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return self._request("GET", "/health", None, timeout=2).status_code == 200
        return False

    def _base_model(self) -> str:
        """The name the server serves its base model under (the model without a parent)."""
        response = self._request("GET", "/v1/models", None)
        if response.status_code == 401:
            raise ConfigError(
                "_internal_config.vllm_runtime.api_key",
                f"the vLLM server at {self.url!r} refused it (401)",
                "Give the key the server was started with (--api-key / VLLM_API_KEY)",
            )
        if response.status_code != 200:
            raise ConfigError(
                _FIELD,
                f"{self.url!r} answered /v1/models with {response.status_code}: is it vLLM?",
                f"Point server_url at a vLLM OpenAI server. {_LAUNCH_HINT}",
            )
        bases = [m for m in response.json().get("data", []) if m.get("parent") is None]
        if not bases:
            raise ConfigError(_FIELD, f"{self.url!r} serves no base model", _LAUNCH_HINT)
        base = bases[0]
        served_len = base.get("max_model_len")
        if isinstance(served_len, int) and served_len < self.context_length:
            raise ConfigError(
                "_internal_config.engine_args.max_model_len",
                f"the vLLM server at {self.url!r} serves {served_len} tokens of context, less "
                f"than the {self.context_length} this model's endpoint would accept",
                f"Set engine_args.max_model_len={served_len}, or start the server with "
                f"--max-model-len={self.context_length}",
            )
        return str(base["id"])

    def _require_route(self, path: str, body: dict[str, Any], lacks: str) -> None:
        """A route missing from vLLM's app answers FastAPI's bare `{"detail": "Not Found"}`;
        one that exists answers our probe with its own error (or 422 for a bad body)."""
        response = self._request("POST", path, body)
        if response.status_code == 404 and _is_missing_route(response):
            raise ConfigError(_FIELD, f"the vLLM server at {self.url!r} {lacks}", _LAUNCH_HINT)

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float = 30
    ) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.base_url}{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=timeout,
        )

    def failure(self) -> str | None:
        """Why the server cannot answer (its /health does not), or None while it does."""
        if self._healthy():
            return None
        return f"the external vLLM server at {self.url!r} ({_FIELD}) does not answer /health"

    def exited_within(self, seconds: float) -> bool:
        """Wait up to `seconds` for the server's /health to stop answering."""
        deadline = time.monotonic() + seconds
        while self._healthy():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True

    def stop(self) -> None:
        """Nothing: the server is not ours to stop."""

    def server_path(self, directory: Path) -> str:
        """`directory` as the server sees it (`local_checkpoint_root` to `server_checkpoint_root`)."""
        local, remote = self.runtime.local_checkpoint_root, self.runtime.server_checkpoint_root
        if local is None or remote is None:
            return str(directory)
        relative = os.path.relpath(os.path.abspath(directory), os.path.abspath(local))
        if relative == os.pardir or relative.startswith(os.pardir + os.sep):
            raise ConfigError(
                "_internal_config.vllm_runtime.local_checkpoint_root",
                f"checkpoint {str(directory)!r} is not under {local!r}",
                "Give the folder that holds this backend's path (LocalBackend(path=...))",
            )
        return f"{remote.rstrip('/')}/{relative}"


class ExternalVLLMEngine:
    """`VLLMEngine` on an `ExternalServer`, its adapters named apart from any other client's."""

    serves_training_weights = False
    serves_while_training = True  # the server has its own devices: a step stops nothing

    def __init__(self, server: ExternalServer, tokenizer: Any, stop_token_ids: set[int]) -> None:
        self.server = server
        self._prefix = f"art-{secrets.token_hex(4)}-"
        self._inner = VLLMEngine(
            server,
            tokenizer,
            stop_token_ids=stop_token_ids,
            sleep_while_training=False,
            serves_while_training=True,
        )
        self.grammars: Grammars = self._inner.grammars
        self._loaded: set[str] = set()

    @property
    def active_rows(self) -> int:
        return self._inner.active_rows

    @property
    def samples_merged(self) -> bool:
        return False

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        n: int = 1,
        adapter: str | None = None,
        on_token: OnToken | None = None,
    ) -> list[Sample]:
        remote = None if adapter is None else self._prefix + adapter
        try:
            return await self._inner.generate(
                prompt_ids, params, n=n, adapter=remote, on_token=on_token
            )
        except AdapterGone as gone:
            raise AdapterGone(adapter or "") from gone

    def training(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def load_adapter(self, name: str, directory: Path) -> None:
        path = Path(self.server.server_path(directory))
        try:
            self._inner.load_adapter(self._prefix + name, path)
        except RuntimeError as error:
            raise ConfigError(
                _FIELD,
                f"the vLLM server at {self.server.url!r} could not load checkpoint "
                f"{str(directory)!r} as a LoRA adapter ({error})",
                "Start the server with --enable-lora and a --max-lora-rank at least "
                "peft_args.r; if it runs on another machine or container, give "
                "vllm_runtime.local_checkpoint_root and server_checkpoint_root so that it "
                "finds the checkpoint",
            ) from error
        self._loaded.add(name)

    def unload_adapter(self, name: str) -> None:
        self._inner.unload_adapter(self._prefix + name)
        self._loaded.discard(name)

    def memory_bytes(self) -> int:
        return 0  # the weights are in the server's process

    @property
    def kv_cache_bytes(self) -> int:
        return 0  # the cache is in the server's process

    @property
    def prefix_cache_bytes(self) -> int:
        return 0

    def close(self) -> None:
        """Unload this engine's adapters from the server (which keeps running)."""
        for name in sorted(self._loaded):
            try:
                self.unload_adapter(name)
            except (RuntimeError, httpx.HTTPError):  # the server may be gone: nothing to free
                logger.warning("could not unload adapter %s from %s", name, self.server.url)
        self._inner.close()

    def loaded_names(self) -> Iterator[str]:
        """The adapters' names on the server (what `/v1/models` lists)."""
        return (self._prefix + name for name in sorted(self._loaded))


def check_external_config(config: dev.InternalModelConfig) -> None:
    """Raise `ConfigError` for an engine setting that launches vLLM: the server runs."""
    defaults = dev.EngineArgs()  # a config is rebuilt from its dump: compare values, not sets
    given = [f for f in _LAUNCH_FIELDS if getattr(config.engine_args, f) != getattr(defaults, f)]
    if given:
        raise ConfigError(
            f"_internal_config.engine_args.{given[0]}",
            "says how to launch vLLM, and vllm_runtime.mode is 'external': your server was "
            "launched with its own settings",
            f"Remove {', '.join(given)}, and give them to `vllm serve` instead",
        )


def start_external_vllm_engine(spec: EngineSpec) -> ExternalVLLMEngine:
    """Attach to the server `spec.config.vllm_runtime` names, and check it."""
    runtime = spec.config.external_vllm
    assert runtime is not None
    server = ExternalServer(runtime, spec.context_length)
    engine = ExternalVLLMEngine(server, spec.tokenizer, set(spec.stop_token_ids))
    logger.info("sampling with the external vLLM server at %s", server.base_url)
    return engine


def _is_missing_route(response: httpx.Response) -> bool:
    try:
        return bool(response.json() == {"detail": "Not Found"})
    except ValueError:
        return False


__all__ = [
    "ExternalServer",
    "ExternalVLLMEngine",
    "check_external_config",
    "start_external_vllm_engine",
]
