"""The inference engine seam: everything the model service and the Ray replica ask of an engine.

Two engines implement `Engine`, each in its own folder with its own start function
(`start.py` picks one; nothing else names an engine kind):

- `transformers/`: our continuous-batching decode loop (any torch device; the CPU
  default). In shared mode it decodes from the training model itself and serves the
  adapter being trained live, pausing while a step trains. With its own copy of the
  weights (dedicated mode on the CPU, a Ray replica) it serves checkpoints loaded by
  name, as vLLM does, and keeps serving while a step trains.
- `vllm/`: vLLM's server in a child process started from its own environment
  (`.venv-vllm` or `ART_VLLM_PYTHON`), fed token ids. It holds its own weights and
  serves checkpoints loaded by name; on a GPU it shares with training it sleeps while a
  step trains, on GPUs of its own (dedicated mode) it serves on.

The endpoint renders the chat template and tokenizes; an engine gets token ids and
`SamplingParams` and returns, per sampled sequence, the token ids and their logprobs under
the model's own temperature-1 distribution, which is what the trainer recomputes.

Adapters and requests: `load_adapter` makes a name servable; `unload_adapter` lets the
requests sampling with it finish and fails the ones still waiting for it with
`AdapterGone`, which names the adapter. A request never waits for an adapter that is not
loaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from ...core.data import dev
from ..models import ResolvedModel
from .structured import Grammar, Grammars

OnToken = Callable[[int, int], None]  # (sequence index within the request, token id)
EngineName = Literal["transformers", "vllm"]


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0
    grammar: Grammar | None = None  # sample only what this grammar allows


@dataclass
class Sample:
    """One sampled sequence."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # of each sampled token, temperature 1
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: Literal["stop", "length"] = "length"
    text: str = ""


class EngineUnavailable(RuntimeError):
    """The engine cannot answer now (its process died, or it is restarting); says which."""


class AdapterGone(LookupError):
    """A request named an adapter the engine no longer serves (unloaded, or never loaded)."""

    def __init__(self, adapter: str) -> None:
        super().__init__(f"adapter {adapter!r} is not loaded in this engine")
        self.adapter = adapter


class Engine(Protocol):
    """Samples token ids for the model service's endpoint."""

    grammars: Grammars
    serves_training_weights: bool
    """True: the engine samples from the model being trained (an adapter is served live by
    its name). False: it holds its own weights and serves checkpoints loaded by
    `load_adapter`, so the latest step is served as that step's checkpoint."""
    serves_while_training: bool
    """True: a training step needs nothing of this engine (`training()` is a no-op): it
    decodes from its own weights on its own cores or GPUs, so requests are answered while
    a step trains. False: `training()` drains and pauses it."""

    @property
    def active_rows(self) -> int:
        """Sequences being sampled now."""
        ...

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of keys and values this process holds for running sequences (0 where
        they live in another process: vLLM, Ray replicas)."""
        ...

    @property
    def prefix_cache_bytes(self) -> int:
        """Bytes of keys and values this process keeps for prompt prefixes between
        requests (bounded; 0 where there is no such cache in this process)."""
        ...

    @property
    def samples_merged(self) -> bool:
        """True: an adapter is sampled from a plain copy of the weights with it merged in
        (`merge_lora`); False: it is applied beside the base weights at every step."""
        ...

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        n: int = 1,
        adapter: str | None = None,
        on_token: OnToken | None = None,
    ) -> list[Sample]:
        """Sample `n` sequences for one prompt with `adapter` (None: the base model).

        Cancelling the awaiting task abandons the request.
        """
        ...

    def training(self) -> contextlib.AbstractContextManager[None]:
        """Held around a training step, or any change of the training model: what the
        engine must stop for it. Running requests finish and new ones wait where the
        engine shares the trainer's weights or GPU; nothing where it serves beside it."""
        ...

    def load_adapter(self, name: str, directory: Path) -> None:
        """Serve the PEFT adapter saved in `directory` as `name`."""
        ...

    def unload_adapter(self, name: str) -> None:
        """Stop serving `name`: requests sampling with it finish first, and requests still
        waiting for it fail with `AdapterGone`."""
        ...

    def memory_bytes(self) -> int:
        """Bytes of weights this engine holds beyond the trainer's (its own copies; 0
        where it samples from the training model, or holds them in another process)."""
        ...

    def close(self) -> None:
        """Stop serving: requests still waiting fail; a child process is stopped."""
        ...


@dataclass(frozen=True)
class EngineSpec:
    """What an engine for one base model needs to start; each engine's start function
    takes one (`start.py` picks which)."""

    resolved: ResolvedModel
    config: dev.InternalModelConfig
    tokenizer: Any
    dtype: str
    context_length: int
    stop_token_ids: frozenset[int]
    log_dir: Path  # where an engine with a child server writes its log
    index: int  # this engine's number among those the caller started (names its log)
    max_loras: int  # adapters an engine with a fixed number of LoRA slots must hold at once


def text_until_stop(text: str, stop: tuple[str, ...]) -> str | None:
    """`text` cut before the earliest stop string in it; None if it holds none."""
    hits = [text.find(s) for s in stop if s in text]
    return text[: min(hits)] if hits else None


__all__ = [
    "AdapterGone",
    "Engine",
    "EngineName",
    "EngineSpec",
    "EngineUnavailable",
    "OnToken",
    "Sample",
    "SamplingParams",
    "text_until_stop",
]
