"""The transformers engine decodes on the process's torch thread, in turn with other work.

- Decoding and work run through `engine.exclusive` happen on one thread, the process's
  `torch_thread.shared()` (one OpenMP team per process: see torch_thread.py).
- Exclusive work waits for the running rows to finish, and requests sent meanwhile wait
  for the work: the same contract `paused()` gives another thread.
- A thread already holding `paused()` may call `exclusive` (e.g. load an adapter) without
  waiting on itself.
- A failing job is delivered to its caller and the thread goes on.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from art.runtime import torch_thread
from art.runtime.engines.base import SamplingParams
from art.runtime.engines.transformers.engine import TransformersEngine

pytestmark = pytest.mark.model  # loads the default model or starts a model service


def _engine(model: Any, tokenizer: Any) -> TransformersEngine:
    return TransformersEngine(
        model,
        tokenizer,
        max_num_seqs=8,
        stop_token_ids=set(),  # every request runs to max_tokens
    )


def _prompt(tokenizer: Any, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )
    return list(rendered["input_ids"])


def test_decoding_and_exclusive_work_run_on_the_process_torch_thread(
    default_model: tuple[Any, Any],
) -> None:
    model, tokenizer = default_model
    engine = _engine(model, tokenizer)
    try:
        assert engine.thread is torch_thread.shared()
        decoding: set[int] = set()
        params = SamplingParams(max_tokens=4)

        async def sample() -> None:
            await engine.generate(
                _prompt(tokenizer, "Hi."),
                params,
                on_token=lambda _i, _t: decoding.add(threading.get_ident()),
            )

        asyncio.run(sample())
        working = engine.exclusive(threading.get_ident)
        assert decoding == {working}
        assert working != threading.get_ident()
        assert engine.thread.run(threading.get_ident) == working
    finally:
        engine.close()


def test_exclusive_work_waits_for_running_rows_and_new_requests_wait_for_it(
    default_model: tuple[Any, Any],
) -> None:
    model, tokenizer = default_model
    engine = _engine(model, tokenizer)
    events: list[str] = []
    first_token, work_started = threading.Event(), threading.Event()

    def work() -> None:
        events.append("work starts")
        work_started.set()
        time.sleep(0.3)  # a request sent meanwhile must not decode before this returns
        events.append("work ends")

    def on_running_token(_index: int, _token: int) -> None:
        events.append("running")
        first_token.set()

    async def scenario() -> None:
        running = asyncio.create_task(
            engine.generate(
                _prompt(tokenizer, "Write one line about the sea."),
                SamplingParams(max_tokens=24),
                on_token=on_running_token,
            )
        )
        await asyncio.to_thread(first_token.wait)
        exclusive = asyncio.create_task(asyncio.to_thread(engine.exclusive, work))
        await asyncio.to_thread(work_started.wait)
        waiting = asyncio.create_task(
            engine.generate(
                _prompt(tokenizer, "Hi."),
                SamplingParams(max_tokens=3),
                on_token=lambda _i, _t: events.append("waiting"),
            )
        )
        await asyncio.gather(running, exclusive, waiting)

    try:
        asyncio.run(scenario())
    finally:
        engine.close()
    # The running request's rows finished first; the request sent during the work waited.
    assert events == ["running"] * 24 + ["work starts", "work ends"] + ["waiting"] * 3


def test_a_thread_holding_the_pause_may_run_exclusive_work(
    default_model: tuple[Any, Any],
) -> None:
    model, tokenizer = default_model
    engine = _engine(model, tokenizer)
    result: list[int] = []
    try:

        def pause_then_work() -> None:
            with engine.paused():
                result.append(engine.exclusive(threading.get_ident))

        thread = threading.Thread(target=pause_then_work, daemon=True)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive(), "exclusive() waited on the pause its caller holds"
        assert result == [thread.ident]  # run where the pause is held

        async def sample() -> int:  # and the engine serves again afterwards
            (done,) = await engine.generate(_prompt(tokenizer, "Hi."), SamplingParams(max_tokens=2))
            return len(done.token_ids)

        assert asyncio.run(sample()) == 2
    finally:
        engine.close()


def test_a_failing_job_reaches_its_caller_and_the_thread_goes_on() -> None:
    thread = torch_thread.TorchThread(name="art-torch-test")

    def fail() -> None:
        raise ValueError("job failed")

    with pytest.raises(ValueError, match="job failed"):
        thread.run(fail)
    assert thread.run(lambda: 7) == 7
    order: list[int] = []
    futures = [thread.submit(lambda i=i: order.append(i)) for i in range(5)]
    for future in futures:
        future.result(timeout=10)
    assert order == [0, 1, 2, 3, 4]  # in the order submitted
