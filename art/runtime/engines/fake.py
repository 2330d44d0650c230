"""`FakeEngine`: an `Engine` that loads no model and answers from a script, for tests.

As httpx's `MockTransport` stands in for the network, this stands in for sampling: the
endpoint, routing and anything else above the `Engine` protocol can be tested in
milliseconds, with exactly known token ids and logprobs. Give it the samples to return,
or a function of the request that returns them:

    engine = FakeEngine(tokenizer, [Sample(token_ids=[5, 6], logprobs=[-0.1, -0.2])])
    engine = FakeEngine(tokenizer, lambda request: [...] * request.n)

A list is returned row by row: row `i` of a request gets `samples[i % len(samples)]`, so
one sample answers every row of an `n > 1` request. A sample without `text` gets its
token ids decoded by `tokenizer`, as an engine's do. The script is returned as written:
`SamplingParams` (max_tokens, stop strings, grammars) are recorded, not applied.

Every request is recorded in `requests`, in order. Adapters behave as the protocol says:
a request naming one that `load_adapter` has not loaded (or `unload_adapter` removed)
fails with `AdapterGone`; after `close()` requests fail with `EngineUnavailable`. It is
picked by no config: tests construct it and hand it to whatever routes to engines.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .base import AdapterGone, EngineUnavailable, OnToken, Sample, SamplingParams
from .structured import Grammars


@dataclass(frozen=True)
class FakeRequest:
    """One request as the fake engine received it."""

    prompt_ids: list[int]
    params: SamplingParams
    n: int
    adapter: str | None


Script = Sequence[Sample] | Callable[[FakeRequest], Sequence[Sample]]


class FakeEngine:
    """Answers each request with scripted samples; see the module docstring."""

    serves_training_weights = False  # it holds "its own weights": checkpoints load by name
    serves_while_training = True  # nothing to pause
    samples_merged = False

    def __init__(
        self, tokenizer: Any, script: Script, *, stop_token_ids: frozenset[int] = frozenset()
    ) -> None:
        if not callable(script) and not script:
            raise ValueError("FakeEngine needs at least one sample to answer with")
        self.tokenizer = tokenizer
        self.script = script
        self.grammars = Grammars(tokenizer, set(stop_token_ids))
        self.requests: list[FakeRequest] = []
        self.adapters: dict[str, Path] = {}  # loaded adapter name -> its directory
        self.closed = False
        self._active_rows = 0

    @property
    def active_rows(self) -> int:
        return self._active_rows

    @property
    def kv_cache_bytes(self) -> int:
        return 0  # it computes nothing

    @property
    def prefix_cache_bytes(self) -> int:
        return 0

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        n: int = 1,
        adapter: str | None = None,
        on_token: OnToken | None = None,
    ) -> list[Sample]:
        if self.closed:
            raise EngineUnavailable("the fake engine was closed")
        if adapter is not None and adapter not in self.adapters:
            raise AdapterGone(adapter)
        request = FakeRequest(list(prompt_ids), params, n, adapter)
        self.requests.append(request)
        samples = [self._copy(sample) for sample in self._answer(request)]
        self._active_rows += n
        try:
            await asyncio.sleep(0)  # a real engine's await: the request may be cancelled here
        finally:
            self._active_rows -= n
        if on_token is not None:
            for row, sample in enumerate(samples):
                for token_id in sample.token_ids:
                    on_token(row, token_id)
        return samples

    def training(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def load_adapter(self, name: str, directory: Path) -> None:
        self.adapters[name] = directory

    def unload_adapter(self, name: str) -> None:
        self.adapters.pop(name, None)

    def memory_bytes(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True

    def _answer(self, request: FakeRequest) -> list[Sample]:
        if callable(self.script):
            samples = list(self.script(request))
            if len(samples) != request.n:
                raise ValueError(
                    f"the FakeEngine script returned {len(samples)} samples for n={request.n}"
                )
            return samples
        return [self.script[row % len(self.script)] for row in range(request.n)]

    def _copy(self, sample: Sample) -> Sample:
        """`sample` as an engine returns it: its own lists, and its text decoded if unset."""
        if len(sample.logprobs) != len(sample.token_ids):
            raise ValueError(
                f"a scripted sample has {len(sample.token_ids)} token ids and "
                f"{len(sample.logprobs)} logprobs; give one logprob per token"
            )
        text = sample.text or self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        return replace(
            sample,
            token_ids=list(sample.token_ids),
            logprobs=list(sample.logprobs),
            top_logprobs=[list(row) for row in sample.top_logprobs],
            text=text,
        )


__all__ = ["FakeEngine", "FakeRequest"]
