"""Requests and their rows: what each sampled sequence holds, and when it stops.

A request asks for `n` sequences of one prompt; each is a row of the running batch. A
row takes one sampled token per decode step (`advance`): its grammar must accept it, its
streaming callback sees it, and it stops at a stop token, a stop string, or `max_tokens`.
A request is answered when its last row stops. Each row fails alone: an error of its
grammar or callback fails its own request, never a neighbour's.
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from ..base import OnToken, Sample, SamplingParams, text_until_stop
from ..structured import Grammars
from ..token_text import StopWatch, TokenText


@dataclass
class Request:
    """One generate call: its prompt, sampling settings and the future its caller awaits."""

    prompt_ids: list[int]
    params: SamplingParams
    n: int
    adapter: str | None
    on_token: OnToken | None
    future: concurrent.futures.Future[list[Sample]]
    samples: list[Sample] = field(default_factory=list)
    unfinished: int = 0
    # Set once the future is done. `ended` is read for every row at every decode step, and
    # `Future.done()` takes the future's lock each time: ~0.4 us a call here, ~0.2 ms a
    # step at 256 rows, where a GPU step's whole host work is about a millisecond.
    _done: threading.Event = field(default_factory=threading.Event, init=False, repr=False)

    def __post_init__(self) -> None:
        done = self._done  # not `self`: the future then holds no reference to the request
        self.future.add_done_callback(lambda _: done.set())

    @property
    def ended(self) -> bool:
        """Answered, failed, or abandoned by its caller (a cancelled future)."""
        return self._done.is_set()

    def fail(self, error: BaseException) -> None:
        settle(self.future, error=error)

    @property
    def repeatable(self) -> bool:
        """Whether its answer must be the same every time: greedy or seeded."""
        return self.params.seed is not None or self.params.temperature == 0


@dataclass
class Row:
    """One sampled sequence of a request."""

    request: Request
    index: int
    sample: Sample
    generator: torch.Generator | None
    matcher: Any = None  # llguidance.LLMatcher of the request's grammar, if it has one
    stops: StopScan | None = None  # made at its first token where the request has stop strings
    done: bool = False


class StopScan:
    """Finds the first of a row's stop strings as its text grows, one token at a time.

    Each token's text is read once (`TokenText`) and only the new text, with the tail a
    stop string could start in, is searched (`StopWatch`); the text answered is `tokenizer.decode`'s,
    cut where the stop string starts. Where `TokenText` decodes the whole ids anyway (see
    there), or a stop string is empty, the whole text is searched every step, as before.
    """

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        text = TokenText(tokenizer)
        # An empty stop string is found in any text, the empty text of a special token too.
        self._scan = (text, StopWatch(stop)) if text.streams and all(stop) else None

    def until_stop(self, token_ids: list[int]) -> str | None:
        """The text of `token_ids` (the last one new since the previous call) cut before its
        first stop string; None while it holds none."""
        if self._scan is not None:
            text, watch = self._scan
            watch.feed(text.add(token_ids[-1]))
            if not watch.seen:
                return None
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        return text_until_stop(text, self.stop)


def new_rows(request: Request) -> list[Row]:
    """The request's `n` rows, each with its own seeded generator and grammar matcher."""
    request.samples = [Sample() for _ in range(request.n)]
    request.unfinished = request.n
    rows = []
    for index, sample in enumerate(request.samples):
        generator = None
        if request.params.seed is not None:
            generator = torch.Generator().manual_seed(request.params.seed + index)
        grammar = request.params.grammar
        matcher = grammar.matcher() if grammar is not None else None
        rows.append(Row(request, index, sample, generator, matcher))
    return rows


class RowStepper:
    """Gives rows their sampled tokens: grammar, callback, stops, and the answer."""

    def __init__(self, tokenizer: Any, stop_token_ids: set[int], grammars: Grammars) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids = stop_token_ids
        self.grammars = grammars

    def constrain(self, logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
        """The logits to sample from: the constrained rows' disallowed tokens at -inf."""
        constrained = [i for i, row in enumerate(rows) if row.matcher is not None]
        if not constrained:
            return logits
        matchers = [rows[i].matcher for i in constrained]
        allowed = self.grammars.allowed_tokens(matchers, logits.shape[1])
        allowed = allowed.to(logits.device, non_blocking=True)
        index = torch.tensor(constrained).to(logits.device, non_blocking=True)
        masked = logits.clone()
        masked[index] = logits[index].masked_fill(~allowed, float("-inf"))
        return masked

    def advance(
        self, row: Row, token: int, logprob: float, top_logprobs: list[tuple[int, float]]
    ) -> None:
        """Give `row` its sampled token (its logprob, and the `top_logprobs` it asked for);
        answer its request once all its rows are done."""
        if row.matcher is not None and not row.matcher.consume_token(token):
            raise RuntimeError(f"the grammar rejected its own token: {row.matcher.get_error()}")
        self._append(row, token, logprob, top_logprobs)
        if row.request.on_token is not None:
            row.request.on_token(row.index, token)
        if row.done:
            row.request.unfinished -= 1
            if row.request.unfinished == 0:
                settle(row.request.future, result=row.request.samples)

    def _append(
        self, row: Row, token: int, logprob: float, top_logprobs: list[tuple[int, float]]
    ) -> None:
        params, sample = row.request.params, row.sample
        sample.token_ids.append(token)
        sample.logprobs.append(logprob)
        if params.top_logprobs:
            sample.top_logprobs.append(top_logprobs)
        if token in self.stop_token_ids:
            sample.finish_reason, row.done = "stop", True
        elif params.stop:
            if row.stops is None:
                row.stops = StopScan(self.tokenizer, params.stop)
            until_stop = row.stops.until_stop(sample.token_ids)
            if until_stop is not None:
                sample.text = until_stop
                sample.finish_reason, row.done = "stop", True
                return
        if not row.done and len(sample.token_ids) >= params.max_tokens:
            sample.finish_reason, row.done = "length", True
        if row.done:
            sample.text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)


def settle(
    future: concurrent.futures.Future[list[Sample]],
    *,
    result: list[Sample] | None = None,
    error: BaseException | None = None,
) -> None:
    """Answer `future` unless it is already done; a caller may cancel at any moment."""
    try:
        if error is not None:
            future.set_exception(error)
        elif result is not None:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass  # cancelled (its caller went away) or already failed: nobody is waiting


__all__ = ["Request", "Row", "RowStepper", "StopScan", "new_rows", "settle"]
