"""The vLLM engine: token ids in, token ids and logprobs out, LoRA checkpoints loaded by name.

Requests go to the child server's token-in, token-out API (`/inference/v1/generate`):
our endpoint has already rendered and tokenized the prompt, vLLM samples, and each
sequence comes back as token ids with the logprob of each sampled id under the model's
raw (temperature-1) distribution, vLLM's default `raw_logprobs` mode. Nothing is
re-tokenized. A grammar goes as llguidance's own grammar text to vLLM's `guidance`
structured-output backend, so the same schemas constrain both engines alike.

Adapters are vLLM LoRA adapters loaded at run time from checkpoint directories, one name
per checkpoint. Unloading waits for the requests still sampling with one, so a request
finishes on the adapter it started with. While a step trains (`paused`), new requests
wait, running ones finish, and on a GPU that training shares vLLM sleeps (weights off
the GPU, KV cache freed) and wakes afterwards.

If the server dies, the requests in flight and the next one fail with `EngineUnavailable`
naming the exit code and the log, and the server is restarted in the background with
every adapter it had; requests after that are served again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx

from ....core.capture.exchange_capture import SseScan
from ....core.data.errors import ConfigError
from ..base import (
    AdapterGone,
    EngineSpec,
    EngineUnavailable,
    OnToken,
    Sample,
    SamplingParams,
    text_until_stop,
)
from ..structured import Grammars
from .server import ServerArgs, VLLMServer, require_vllm_python

_TIMEOUT = httpx.Timeout(None, connect=10.0)  # a long completion may take minutes


class Server(Protocol):
    """The vLLM server an engine talks to: one it starts (`VLLMServer`), or one it attaches
    to (`external.ExternalServer`)."""

    base_url: str
    api_key: str

    @property
    def log_path(self) -> Path | str:
        """Where its log is (named in errors)."""
        ...

    @property
    def served_name(self) -> str:
        """The name the server serves the base model under."""
        ...

    def start(self) -> None: ...
    def failure(self) -> str | None: ...
    def exited_within(self, seconds: float) -> bool: ...
    def stop(self) -> None: ...


class VLLMEngine:
    """Serves one base model (and LoRA checkpoints of it) through a vLLM server process."""

    def __init__(
        self,
        server: Server,
        tokenizer: Any,
        *,
        stop_token_ids: set[int],
        sleep_while_training: bool,
        serves_while_training: bool = False,
    ) -> None:
        self.server = server
        self.tokenizer = tokenizer
        self.stop_token_ids = sorted(stop_token_ids)
        self.sleep_while_training = sleep_while_training
        self.grammars = Grammars(tokenizer, stop_token_ids)
        self.serves_training_weights = False
        # Dedicated mode: vLLM has GPUs of its own, so a step needs nothing of it.
        self.serves_while_training = serves_while_training
        self._adapters: dict[str, Path] = {}  # loaded into the server: name -> directory
        self._in_use: dict[str | None, int] = {}  # adapter -> requests sampling with it
        self._rows = 0
        self._state = threading.Condition()
        self._pausing = False
        self._restarting: threading.Thread | None = None
        self._clients = _LoopClients(self._new_client)
        server.start()

    # --- serving ------------------------------------------------------------------------

    @property
    def active_rows(self) -> int:
        return self._rows

    @property
    def samples_merged(self) -> bool:
        return False  # vLLM applies each adapter with its LoRA kernels

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        n: int = 1,
        adapter: str | None = None,
        on_token: OnToken | None = None,
    ) -> list[Sample]:
        await self._admit(adapter, n)
        try:
            body = self._body(prompt_ids, params, n, adapter, stream=on_token is not None)
            try:
                if on_token is None:
                    choices = await self._complete(body)
                else:
                    choices = await self._stream(body, n, on_token)
            except httpx.TransportError as error:
                raise await asyncio.to_thread(self._unavailable, error) from error
            return [self._sample(choice, params) for choice in choices]
        finally:
            with self._state:
                self._in_use[adapter] -= 1
                self._rows -= n
                self._state.notify_all()

    async def _admit(self, adapter: str | None, n: int) -> None:
        """Wait while a step trains; then count this request as sampling with `adapter`."""
        while True:
            with self._state:
                if self._restarting is not None and self._restarting.is_alive():
                    raise EngineUnavailable(
                        "the vLLM server is restarting after it exited; retry in a minute "
                        f"(its log: {self.server.log_path})"
                    )
                if not self._pausing:
                    if adapter is not None and adapter not in self._adapters:
                        raise AdapterGone(adapter)
                    self._in_use[adapter] = self._in_use.get(adapter, 0) + 1
                    self._rows += n
                    return
            await asyncio.sleep(0.05)

    def _body(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        n: int,
        adapter: str | None,
        *,
        stream: bool,
    ) -> dict[str, Any]:
        sampling: dict[str, Any] = {
            "n": n,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": params.seed,
            "logprobs": params.top_logprobs,  # 0: the sampled token's alone
            "stop_token_ids": self.stop_token_ids,
            # Text is only needed to find stop strings; we decode the answer ourselves.
            "detokenize": bool(params.stop),
            "skip_special_tokens": True,
        }
        if params.stop:
            sampling["stop"] = list(params.stop)
        if params.grammar is not None:
            sampling["structured_outputs"] = {"grammar": params.grammar.source}
        body: dict[str, Any] = {
            "token_ids": prompt_ids,
            "model": adapter if adapter is not None else self.server.served_name,
            "sampling_params": sampling,
            "output_mode": "tokens",
        }
        if stream:
            body["stream"] = True
        return body

    async def _complete(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        response = await self._client().post("/inference/v1/generate", json=body)
        _raise_for(response)
        choices: list[dict[str, Any]] = sorted(response.json()["choices"], key=_index)
        return choices

    async def _stream(
        self, body: dict[str, Any], n: int, on_token: OnToken
    ) -> list[dict[str, Any]]:
        """Stream the generation, calling `on_token` per sampled token; the whole choices."""
        choices: list[dict[str, Any]] = [
            {"index": i, "token_ids": [], "logprobs": {"content": []}, "finish_reason": None}
            for i in range(n)
        ]
        async with self._client().stream("POST", "/inference/v1/generate", json=body) as response:
            if response.status_code >= 400:
                await response.aread()
                _raise_for(response)
            received, scan = bytearray(), SseScan()  # the server's stream: SSE events
            async for part in response.aiter_bytes():
                received += part
                events = [data for _, data in scan.new(received) if data != "[DONE]"]
                for delta in (d for data in events for d in json.loads(data).get("choices", [])):
                    choice = choices[delta["index"]]
                    for token in delta.get("token_ids") or []:
                        choice["token_ids"].append(token)
                        on_token(delta["index"], token)
                    content = (delta.get("logprobs") or {}).get("content") or []
                    choice["logprobs"]["content"].extend(content)
                    if delta.get("finish_reason"):
                        choice["finish_reason"] = delta["finish_reason"]
        return choices

    def _sample(self, choice: dict[str, Any], params: SamplingParams) -> Sample:
        token_ids = [int(token) for token in choice.get("token_ids") or []]
        content = (choice.get("logprobs") or {}).get("content") or []
        if len(content) != len(token_ids):
            raise EngineUnavailable(
                f"the vLLM server returned {len(token_ids)} tokens but {len(content)} logprobs"
            )
        sample = Sample(
            token_ids=token_ids, logprobs=[float(entry["logprob"]) for entry in content]
        )
        if params.top_logprobs:
            for entry in content:
                # The sampled token first, then the top candidates: keep the k best ranked.
                ranked = sorted(
                    {c["token_id"]: c for c in entry.get("top_logprobs") or []}.values(),
                    key=lambda c: -float(c["logprob"]),
                )
                sample.top_logprobs.append(
                    [(int(c["token_id"]), float(c["logprob"])) for c in ranked][
                        : params.top_logprobs
                    ]
                )
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        until_stop = text_until_stop(text, params.stop) if params.stop else None
        sample.text = until_stop if until_stop is not None else text
        sample.finish_reason = "length" if choice.get("finish_reason") == "length" else "stop"
        return sample

    def _client(self) -> httpx.AsyncClient:
        return self._clients.get()

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.server.base_url,
            headers={"Authorization": f"Bearer {self.server.api_key}"},
            timeout=_TIMEOUT,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )

    # --- the server's lifecycle ---------------------------------------------------------

    def _unavailable(self, error: Exception) -> EngineUnavailable:
        """The error for a request the server did not answer; restarts a dead server."""
        self.server.exited_within(5.0)  # a dying server refuses connections before it exits
        failure = self.server.failure()
        if failure is None:
            return EngineUnavailable(f"the vLLM server did not answer: {error!r}")
        with self._state:
            if self._restarting is None or not self._restarting.is_alive():
                self._restarting = threading.Thread(
                    target=self._restart, name="art-vllm-restart", daemon=True
                )
                self._restarting.start()
        return EngineUnavailable(f"{failure}\nIt is being restarted; retry in a minute.")

    def _restart(self) -> None:
        base_url = self.server.base_url
        self.server.stop()
        self.server.start()
        if self.server.base_url != base_url:
            self._clients.clear()  # their connections point at the old port
        for name, directory in list(self._adapters.items()):
            self._post_admin(
                "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(directory)}
            )

    # --- adapters and training -------------------------------------------------------

    def load_adapter(self, name: str, directory: Path) -> None:
        self._post_admin("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(directory)})
        with self._state:
            self._adapters[name] = directory

    def unload_adapter(self, name: str) -> None:
        with self._state:
            if name not in self._adapters:
                return
            del self._adapters[name]  # new requests for it are refused from here on
            self._state.wait_for(lambda: not self._in_use.get(name))
        self._post_admin("/v1/unload_lora_adapter", {"lora_name": name})

    def training(self) -> contextlib.AbstractContextManager[None]:
        """A pause (and sleep, on a GPU training shares) unless vLLM has GPUs of its own."""
        return contextlib.nullcontext() if self.serves_while_training else self.paused()

    def memory_bytes(self) -> int:
        """0: vLLM's weights are in its own process."""
        return 0

    @property
    def kv_cache_bytes(self) -> int:
        """0: vLLM's cache is in its own process."""
        return 0

    @property
    def prefix_cache_bytes(self) -> int:
        return 0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._state:
            self._pausing = True
            self._state.wait_for(lambda: self._rows == 0)
        try:
            if self.sleep_while_training:
                self._post_admin("/sleep?level=1", None)
            try:
                yield
            finally:
                if self.sleep_while_training:
                    self._post_admin("/wake_up", None)
        finally:
            with self._state:
                self._pausing = False
                self._state.notify_all()

    def _post_admin(self, path: str, body: dict[str, Any] | None) -> None:
        try:
            response = httpx.post(
                f"{self.server.base_url}{path}",
                json=body,
                headers={"Authorization": f"Bearer {self.server.api_key}"},
                timeout=300,
            )
        except httpx.TransportError as error:
            raise self._unavailable(error) from error
        _raise_for(response)

    def close(self) -> None:
        self.server.stop()
        self._clients.close()


class _LoopClients:
    """One httpx client per event loop: a client's connections belong to its loop.

    Clients are keyed by the loop object, never by `id(loop)`: a closed loop's id can be
    given to a later loop, which would then get a client bound to a dead loop. Holding
    the loop keeps it (and its id) alive while its client is kept; clients of closed
    loops are dropped on the next `get`.
    """

    def __init__(self, make: Callable[[], httpx.AsyncClient]) -> None:
        self._make = make
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._lock = threading.Lock()  # loops in several threads share the engine

    def get(self) -> httpx.AsyncClient:
        """The running loop's client, made on first use (or once it was closed)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            for closed in [other for other in self._clients if other.is_closed()]:
                del self._clients[closed]  # see `close` on why they cannot be closed
            client = self._clients.get(loop)
            if client is None or client.is_closed:
                client = self._clients[loop] = self._make()
            return client

    def clear(self) -> None:
        """Forget every client: each loop makes a new one on its next request."""
        with self._lock:
            self._clients.clear()

    def close(self) -> None:
        """Close each client on its own loop; a client of a closed loop is dropped.

        Only a client's own loop can close its connections. A closed loop cannot run
        `aclose()` (`RuntimeError: Event loop is closed`), so those sockets close when the
        client is collected. A running loop (the endpoint's thread, or this very thread,
        as in a Ray actor's `close`) gets the close as a task; a stopped one runs it here.
        """
        with self._lock:
            clients, self._clients = self._clients, {}
        for loop, client in clients.items():
            if loop.is_closed():
                continue
            if not loop.is_running():
                loop.run_until_complete(client.aclose())
                continue
            closing = client.aclose()
            try:
                asyncio.run_coroutine_threadsafe(closing, loop)
            except RuntimeError:
                closing.close()
                if not loop.is_closed():
                    raise
                # It closed since `is_running()`: dropped, as above.


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        detail = response.json()
        message = detail.get("error", {}).get("message") if isinstance(detail, dict) else None
    except ValueError:
        message = None
    text = f"the vLLM server answered {response.status_code}: {message or response.text[:500]}"
    if response.status_code >= 500:
        raise EngineUnavailable(text)
    raise RuntimeError(text)


def _index(choice: dict[str, Any]) -> int:
    return int(choice["index"])


_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # what vLLM's --max-lora-rank accepts
_CPU_KV_CACHE_BYTES = 1 << 30  # on CPU without gpu_memory_utilization: 46k tokens of SmolLM2


def start_vllm_engine(spec: EngineSpec) -> VLLMEngine:
    """Start a vLLM server for `spec.resolved` as `spec.config` asks, and its engine."""
    import torch

    config = spec.config

    python = require_vllm_python()
    rank = config.peft_args.r
    max_lora_rank = next((allowed for allowed in _LORA_RANKS if allowed >= rank), None)
    if max_lora_rank is None:
        raise ConfigError(
            "_internal_config.peft_args.r",
            f"is {rank}; vLLM serves LoRA adapters up to rank {_LORA_RANKS[-1]}",
            f"Use r <= {_LORA_RANKS[-1]}",
        )
    cuda = torch.cuda.is_available()
    engine_args = config.engine_args
    dedicated = config.inference_gpu_ids is not None
    args = ServerArgs(
        model=spec.resolved.weights,
        served_name="base",
        dtype=spec.dtype,
        max_model_len=spec.context_length,
        max_num_seqs=engine_args.max_num_seqs,
        max_lora_rank=max_lora_rank,
        max_loras=spec.max_loras,
        gpu_memory_utilization=engine_args.gpu_memory_utilization,
        enforce_eager=engine_args.enforce_eager,
        sleep_mode=cuda and not dedicated,
        kv_cache_bytes=(
            _CPU_KV_CACHE_BYTES if not cuda and engine_args.gpu_memory_utilization is None else None
        ),
        gpu_ids=config.inference_gpu_ids,
    )
    server = VLLMServer(python, args, spec.log_dir / f"vllm-{spec.index}.log")
    return VLLMEngine(
        server,
        spec.tokenizer,
        stop_token_ids=set(spec.stop_token_ids),
        sleep_while_training=args.sleep_mode,
        serves_while_training=dedicated,
    )


__all__ = ["Server", "VLLMEngine", "start_vllm_engine"]
