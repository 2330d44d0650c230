"""Capture scopes (`with art.Trajectory() as t:`) as ART 0.5.23 has them: a stack per
context, `no_capture`, `art.trajectory` and `art.trajectory_group`; and an exchange built
from a body and appended to the innermost scope. The HTTP hooks are tested in
tests/core/capture/test_exchange_capture.py."""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading

import pytest

import art
from art.core.capture import capture_scope
from art.core.capture.exchange_capture import begin, build_exchange, protocol_for_url
from art.core.data.exchanges import utc_now


def test_a_scope_is_current_inside_its_block_and_finished_after() -> None:
    assert art.current_trajectory() is None
    with art.Trajectory() as outer:
        assert art.current_trajectory() is outer
        with art.Trajectory() as inner:
            assert art.current_trajectory(require=True) is inner
        assert art.current_trajectory() is outer
        assert "duration" in inner.metrics
        assert "duration" not in outer.metrics
    assert art.current_trajectory() is None
    assert "duration" in outer.metrics


def test_require_outside_a_scope_and_scopes_closed_out_of_order_raise() -> None:
    with pytest.raises(RuntimeError, match="no trajectory is being captured"):
        art.current_trajectory(require=True)
    first, second = art.Trajectory(), art.Trajectory()
    first.__enter__()
    second.__enter__()
    with pytest.raises(capture_scope.CaptureScopeError, match="innermost first"):
        first.__exit__(None, None, None)
    second.__exit__(None, None, None)
    first.__exit__(None, None, None)
    assert art.current_trajectory() is None


def test_no_capture_hides_enclosing_scopes_until_it_ends() -> None:
    with art.Trajectory() as outer:
        with art.no_capture():
            assert art.current_trajectory() is None
            with art.Trajectory() as fresh:
                assert art.current_trajectory() is fresh
            assert art.current_trajectory() is None
        assert art.current_trajectory() is outer


async def test_tasks_and_threads_see_their_own_scopes() -> None:
    seen: dict[str, art.Trajectory | None] = {}

    async def task(name: str) -> None:
        with art.Trajectory() as mine:
            await asyncio.sleep(0)  # the others enter theirs meanwhile
            seen[name] = art.current_trajectory()
            assert seen[name] is mine

    await asyncio.gather(*(task(name) for name in "abc"))
    assert len({id(t) for t in seen.values()}) == 3

    with art.Trajectory() as outer:
        copied = contextvars.copy_context()
        found: list[art.Trajectory | None] = []
        thread = threading.Thread(target=lambda: found.append(copied.run(art.current_trajectory)))
        thread.start()
        thread.join()
        bare: list[art.Trajectory | None] = []
        thread = threading.Thread(target=lambda: bare.append(art.current_trajectory()))
        thread.start()
        thread.join()
    assert found == [outer]  # a copied context carries the scope into the thread
    assert bare == [None]  # a plain thread starts with no scope


async def test_art_trajectory_runs_a_raw_coroutine_in_a_new_scope() -> None:
    async def rollout() -> None:
        art.current_trajectory(require=True).reward = 0.5

    with art.Trajectory() as outer:
        captured = await art.trajectory(rollout())
    assert captured is not outer
    assert captured.reward == 0.5
    assert outer.reward == 0.0
    assert "duration" in captured.metrics
    task = asyncio.ensure_future(asyncio.sleep(0))
    with pytest.raises(TypeError, match="raw coroutine"):
        await art.trajectory(task)  # type: ignore[arg-type]
    await task


async def test_trajectory_group_keeps_order_and_handles_exceptions() -> None:
    async def rollout(reward: float, delay: float) -> art.Trajectory:
        await asyncio.sleep(delay)
        if reward < 0:
            raise ValueError(f"bad rollout {reward}")
        assert art.current_trajectory() is None  # run outside the enclosing scope
        return art.Trajectory(reward=reward)

    ready = art.Trajectory(reward=9)
    with art.Trajectory():
        group = await art.trajectory_group(
            [rollout(1, 0.02), ready, rollout(2, 0.0), rollout(-1, 0.01)],
            metadata={"scenario": "s"},
            metrics={"hard": 1},
            logs=["group"],
            return_exceptions=True,
        )
    assert [t.reward for t in group.trajectories] == [1, 9, 2]
    assert [e.message for e in group.exceptions] == ["bad rollout -1"]
    assert (group.metadata, group.metrics, group.logs) == (
        {"scenario": "s"},
        {"hard": 1},
        ["group"],
    )

    finished: list[float] = []

    async def slow() -> art.Trajectory:
        try:
            await asyncio.sleep(5)
        finally:
            finished.append(1)
        return art.Trajectory()

    with pytest.raises(ValueError, match="bad rollout -2"):
        await art.trajectory_group([slow(), rollout(-2, 0.0)])
    assert finished == [1]  # the other rollout was cancelled, not left running


async def test_the_same_awaitable_twice_runs_once() -> None:
    runs: list[int] = []

    async def rollout() -> art.Trajectory:
        runs.append(1)
        return art.Trajectory(reward=1)

    once = asyncio.ensure_future(rollout())
    group = await art.trajectory_group([once, once])
    assert len(group.trajectories) == 2
    assert runs == [1]


def test_protocols_are_recognised_by_path_on_any_host() -> None:
    assert protocol_for_url("https://api.example.com/v1/chat/completions") == "chat_completions"
    assert protocol_for_url("http://127.0.0.1:8000/v1/completions/") == "completions"
    assert protocol_for_url("http://h/openai/v1/responses?api-version=2") == "responses"
    assert protocol_for_url("http://h/anthropic/v1/messages") == "messages"
    assert protocol_for_url("http://h/v1/models") is None
    body = json.dumps({"model": "m", "messages": []}).encode()
    assert begin("POST", "http://h/v1/chat/completions", body) is None  # no scope
    with art.Trajectory():
        assert begin("GET", "http://h/v1/chat/completions", body) is None
        assert begin("POST", "http://h/v1/chat/completions", b"not json") is None
        assert begin("POST", "http://h/v1/chat/completions", body) is not None


def test_a_streamed_chat_completion_is_reassembled_with_tool_calls_and_our_fields() -> None:
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "On "}}]},
        {"choices": [{"index": 0, "delta": {"content": "it", "tool_calls": [
            {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "look", "arguments": '{"q": '}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": '"x"}'}}]}, "finish_reason": "tool_calls",
            "prompt_token_ids": [1, 2], "token_ids": [3, 4, 5], "token_logprobs": [-1.0, -2.0, -3.0],
            "policy_version": 7}]},
    ]  # fmt: skip
    top = {"id": "c1", "object": "chat.completion.chunk", "created": 3, "model": "m"}
    body = b"".join(f"data: {json.dumps({**top, **c})}\n\n".encode() for c in chunks)
    body += b"data: [DONE]\n\n"
    now = utc_now()
    request = {"model": "m", "messages": [], "stream": True}
    exchange = build_exchange("chat_completions", request, body, start_time=now, end_time=now)
    (choice,) = exchange.response.choices
    assert choice.message.content == "On it"
    assert choice.message.tool_calls is not None
    assert choice.message.tool_calls[0].function.arguments == '{"q": "x"}'  # type: ignore[union-attr]
    assert (choice.finish_reason, choice.model_extra) == (
        "tool_calls",
        {"prompt_token_ids": [1, 2], "token_ids": [3, 4, 5], "token_logprobs": [-1.0, -2.0, -3.0],
         "policy_version": 7},
    )  # fmt: skip
    unfinished = b"".join(f"data: {json.dumps({**top, **c})}\n\n".encode() for c in chunks[:2])
    with pytest.raises(ValueError, match="before choices"):
        build_exchange("chat_completions", request, unfinished, start_time=now, end_time=now)
