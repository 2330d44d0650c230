"""The inference engine seam: what the model service and the OpenAI endpoint ask of an engine.

Two engines implement `Engine`:

- `transformers_engine.TransformersEngine`: our continuous-batching decode loop over the
  training model itself (any torch device; the CPU default). It serves the adapter being
  trained live, so a finished step is served at once. In dedicated mode on the CPU it
  decodes from a serving copy of the weights instead and serves checkpoints loaded by
  name, as vLLM does, so it keeps serving while a step trains.
- `vllm_engine.VLLMEngine`: vLLM's server in a child process started from its own
  environment (`.venv-vllm` or `ART_VLLM_PYTHON`), fed token ids. It holds its own copy of
  the weights and serves checkpoints: each saved adapter is loaded into it by name.

The endpoint renders the chat template and tokenizes; an engine gets token ids and
`SamplingParams` and returns, per sampled sequence, the token ids and their logprobs under
the model's own temperature-1 distribution, which is what the trainer recomputes. Which
engine runs is `InternalModelConfig.engine` (see `choose_engine`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from ....core import dev
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


class Engine(Protocol):
    """Samples token ids for the model service's endpoint."""

    grammars: Grammars
    serves_training_weights: bool
    """True: the engine samples from the model being trained (an adapter is served live by
    its name). False: it holds its own weights and serves checkpoints loaded by
    `load_adapter`, so the latest step is served as that step's checkpoint."""

    @property
    def active_rows(self) -> int:
        """Sequences being sampled now."""
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

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """Sole use of the model for training: running requests finish, new ones wait."""
        ...

    def load_adapter(self, name: str, directory: Path) -> None:
        """Serve the PEFT adapter saved in `directory` as `name`."""
        ...

    def unload_adapter(self, name: str) -> None:
        """Stop serving `name`; requests already sampling with it finish first."""
        ...

    def close(self) -> None: ...


def choose_engine(config: dev.InternalModelConfig) -> EngineName:
    """The engine `config` asks for; unset: vLLM where CUDA and vLLM are both here."""
    if config.engine is not None:
        return config.engine
    from .vllm.server import find_vllm_python

    if find_vllm_python() is None:
        return "transformers"
    import torch

    return "vllm" if torch.cuda.is_available() else "transformers"


def text_until_stop(text: str, stop: tuple[str, ...]) -> str | None:
    """`text` cut before the earliest stop string in it; None if it holds none."""
    hits = [text.find(s) for s in stop if s in text]
    return text[: min(hits)] if hits else None


__all__ = [
    "Engine",
    "EngineName",
    "EngineUnavailable",
    "OnToken",
    "Sample",
    "SamplingParams",
    "choose_engine",
    "text_until_stop",
]
