"""A decode-loop request knows when it has ended, whoever ended it."""

from __future__ import annotations

import concurrent.futures
import threading

from art.runtime.engines.base import SamplingParams
from art.runtime.engines.transformers.rows import Request, settle


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
