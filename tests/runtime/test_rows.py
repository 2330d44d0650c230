"""A decode-loop request knows when it has ended, whoever ended it; a row stops at the
first stop string its text holds, reading each token's text once."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import pytest
from helpers import TOKENIZER_KINDS, tokenizer_of_kind

from art.runtime.engines.base import Sample, SamplingParams
from art.runtime.engines.structured import Grammars
from art.runtime.engines.transformers.rows import Request, RowStepper, new_rows, settle


def request() -> Request:
    return Request([1, 2], SamplingParams(max_tokens=4), 1, None, None, concurrent.futures.Future())


def test_a_request_ends_when_answered_failed_or_cancelled_from_another_thread() -> None:
    answered, failed, cancelled, waiting = request(), request(), request(), request()
    settle(answered.future, result=[])
    failed.fail(RuntimeError("its grammar refused the token"))
    canceller = threading.Thread(target=cancelled.future.cancel)  # a caller that went away
    canceller.start()
    canceller.join()
    assert [answered.ended, failed.ended, cancelled.ended, waiting.ended] == [
        True,
        True,
        True,
        False,
    ]
    done = concurrent.futures.Future()
    done.set_result([])
    assert Request([1], SamplingParams(max_tokens=1), 1, None, None, done).ended  # done before


class CountingDecodes:
    """The tokenizer, counting its whole-text decodes."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.decodes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)

    def decode(self, *args: Any, **kwargs: Any) -> str:
        self.decodes += 1
        return self.tokenizer.decode(*args, **kwargs)


# Multi-byte characters split across tokens, and stop strings that start inside one
# token and end in another.
TEXT = "Grüße aus Zürich 🍕 nach 東京, then a long tail of words. " * 6


@pytest.fixture(scope="module", params=TOKENIZER_KINDS)
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return tokenizer_of_kind(request.param, TEXT)


def stopped_at(tokenizer: Any, ids: list[int], stop: tuple[str, ...]) -> tuple[int, Sample]:
    """Feeds `ids` one at a time to a row asking for `stop`: the tokens it took, its sample."""
    params = SamplingParams(max_tokens=len(ids), stop=stop)
    request = Request([1], params, 1, None, None, concurrent.futures.Future())
    (row,) = new_rows(request)
    stepper = RowStepper(tokenizer, set(), Grammars(tokenizer, set()))
    for token in ids:
        stepper.advance(row, token, -1.0, [])
        if row.done:
            break
    return len(row.sample.token_ids), row.sample


@pytest.mark.parametrize(
    "stop",
    [("東京",), ("ch 🍕",), ("tail of", "Zürich"), ("words. Gr",), ("never seen",), ("",)],
)
@pytest.mark.parametrize("cleans_up", [False, True])
def test_a_row_stops_where_the_decoded_text_first_holds_a_stop_string(
    tokenizer: Any, stop: tuple[str, ...], cleans_up: bool
) -> None:
    """The step a row stops at and its text are what decoding the whole completion after
    every token finds (the rule before rows read each token's text once); a tokenizer that
    cleans up spaces after decoding still decodes the whole text each step."""
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    expected_tokens, expected_text = len(ids), tokenizer.decode(ids, skip_special_tokens=True)
    for taken in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:taken], skip_special_tokens=True)
        if any(s in text for s in stop):
            expected_tokens = taken
            expected_text = text[: min(text.find(s) for s in stop if s in text)]
            break
    shown = CountingDecodes(tokenizer)
    if cleans_up:
        shown.clean_up_tokenization_spaces = True  # type: ignore[attr-defined]
    taken, sample = stopped_at(shown, ids, stop)
    assert (taken, sample.text) == (expected_tokens, expected_text)
    assert sample.finish_reason == ("length" if stop == ("never seen",) else "stop")
    if not cleans_up and all(stop):
        assert shown.decodes <= 2  # once to confirm a stop string, once for the answer
    else:
        assert shown.decodes >= taken
