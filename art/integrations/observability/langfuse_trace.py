"""Langfuse: one trace per rollout, its chat completions inside, its reward on it.

With Langfuse's own environment (`LANGFUSE_PUBLIC_KEY`, `LANGFUSE_SECRET_KEY`,
`LANGFUSE_BASE_URL` or `LANGFUSE_HOST`), each rollout that `art.gather_trajectory_groups`
(or `gather_trajectories`) runs becomes a Langfuse trace: a root span named after the
rollout function, one generation per chat completion sent through `model.openai_client()`
(and so through `art.langgraph` and `art.mcp`, which use the same transport), and, when
the rollout returns, the trajectory's reward and metrics as the root span's metadata and
its reward as the trace's `reward` score. The trajectory keeps the trace's id in its
metadata (`langfuse_trace_id`). A rollout that raised marks its span as an error.

Everything goes through the Langfuse SDK's own instrumentation API (OpenTelemetry spans
it exports to `<base_url>/api/public/otel`); nothing of the OpenAI client is patched.
`LANGFUSE_TRACING_ENABLED=false` (Langfuse's own switch) turns it off. Generations keep
the messages but not the token ids and logprobs a trainable model's responses carry.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from ...core.capture.exchange_capture import assemble_chat_stream, request_json
from ...core.data.trajectories import Trajectory
from ._warn import warn_once

# The request fields worth seeing next to a generation (its sampling settings).
_PARAMETERS = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "n", "seed", "stop")

_client: Any = None
_client_lock = threading.Lock()
_checked = threading.Event()  # the connection check has finished (its warning said, if any)


def _langfuse() -> Any:
    """The Langfuse client, made once; None (and one warning) where it cannot work."""
    global _client
    with _client_lock:
        if _client is not None:
            return _client or None
        missing = [
            name
            for name in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY")
            if not os.environ.get(name)
        ]
        if missing:
            warn_once(
                "langfuse-key",
                f"Langfuse is configured without {' and '.join(missing)}: rollouts are not traced",
            )
            return _unusable()
        try:
            from langfuse import Langfuse
        except ImportError:
            warn_once(
                "langfuse-missing",
                "Langfuse keys are set but langfuse is not installed (pip install "
                "'art-grpo[langfuse]'): rollouts are not traced",
            )
            return _unusable()
        client = Langfuse()
        _client = client
    # Spans are exported from Langfuse's own thread, so an unreachable server never slows a
    # rollout; this check, on a thread too, is what says so (once) instead of silence.
    threading.Thread(target=_check, args=(client,), name="art-langfuse-check", daemon=True).start()
    return client


def _unusable() -> None:
    global _client
    _client = False  # decided: no tracing in this process
    _checked.set()  # nothing to check
    return None


def _check(client: Any) -> None:
    where = (
        os.environ.get("LANGFUSE_BASE_URL")
        or os.environ.get("LANGFUSE_HOST")
        or "https://cloud.langfuse.com"
    )
    try:
        client.auth_check()
    except Exception as error:
        warn_once(
            "langfuse-unreachable",
            f"Langfuse at {where} did not accept this run ({type(error).__name__}: {error}); "
            "rollout traces will not arrive there, and training goes on",
        )
    finally:
        _checked.set()


def wait_for_connection_check(timeout: float | None = None) -> bool:
    """Wait until the check of Langfuse's server has said whether it answers."""
    return _checked.wait(timeout)


class _RolloutTrace:
    def __init__(self, span: Any) -> None:
        self._span = span

    def finish(self, outcome: object) -> None:
        with _sdk_guard("the end of a rollout"):
            self._record(outcome)

    def _record(self, outcome: object) -> None:
        if isinstance(outcome, Trajectory):
            outcome.metadata.setdefault("langfuse_trace_id", self._span.trace_id)
            self._span.update(
                output=_last_answer(outcome),
                metadata={
                    "reward": outcome.reward,
                    "metrics": dict(outcome.metrics),
                    "trajectory_metadata": dict(outcome.metadata),
                },
            )
            self._span.score_trace(name="reward", value=float(outcome.reward))
        elif isinstance(outcome, BaseException):
            self._span.update(level="ERROR", status_message=f"{type(outcome).__name__}: {outcome}")


@contextmanager
def rollout_trace(name: str = "rollout") -> Iterator[_RolloutTrace | None]:
    """A root span for one rollout; the rollout's chat completions nest inside it."""
    client = _langfuse()
    if client is None:
        yield None
        return
    with ExitStack() as stack:
        span = None
        with _sdk_guard("the start of a rollout"):
            span = stack.enter_context(
                client.start_as_current_observation(name=name, as_type="span")
            )
        yield None if span is None else _RolloutTrace(span)


class _ChatTrace:
    def __init__(self, generation: Any) -> None:
        self._generation = generation

    def finish(self, status: int, body: bytes) -> None:
        with _sdk_guard("a chat completion"):
            self._record(status, body)

    def _record(self, status: int, body: bytes) -> None:
        if status >= 400:
            text = body.decode("utf-8", errors="replace")
            self._generation.update(level="ERROR", status_message=f"HTTP {status}: {text[:500]}")
        else:
            output, usage = _answer(body)
            self._generation.update(output=output, usage_details=usage or None)
        self._generation.end()

    def fail(self, reason: str) -> None:
        with _sdk_guard("a failed chat completion"):
            self._generation.update(level="ERROR", status_message=reason)
            self._generation.end()


def chat_trace(request: dict[str, Any]) -> _ChatTrace | None:
    """A generation for one chat completion, inside the current rollout's span."""
    client = _langfuse()
    if client is None:
        return None
    parameters = {key: request[key] for key in _PARAMETERS if key in request}
    with _sdk_guard("the start of a chat completion"):
        generation = client.start_observation(
            name="chat.completions",
            as_type="generation",
            model=str(request.get("model", "")),
            input=request.get("messages"),
            model_parameters=parameters or None,
        )
        return _ChatTrace(generation)
    return None


@contextmanager
def _sdk_guard(what: str) -> Iterator[None]:
    """A failure inside the Langfuse SDK costs the trace, never the rollout: say it once."""
    try:
        yield
    except Exception as error:
        warn_once(
            "langfuse-sdk",
            f"Langfuse could not record {what} ({type(error).__name__}: {error}); "
            "traces may be incomplete, and the rollouts go on",
        )


def _answer(body: bytes | str) -> tuple[Any, dict[str, int]]:
    """The assistant message(s) and token usage of a chat completion (JSON or SSE); a
    stream is put together by the capture pipeline's re-assembler, finished or not."""
    raw = body.encode() if isinstance(body, str) else body
    whole = request_json(raw)
    try:
        top, choices = (
            (whole, whole.get("choices") or [])
            if whole
            else assemble_chat_stream(raw, finished=False)
        )
    except (ValueError, KeyError, TypeError):  # no choice, an error event, a malformed one
        return raw.decode("utf-8", errors="replace")[:2000], {}
    answers = [
        {key: value for key, value in choice.get("message", {}).items() if value is not None}
        for choice in sorted(choices, key=lambda choice: int(choice.get("index", 0)))
    ]
    counts = top.get("usage") or {}
    usage = {
        ours: counts[theirs]
        for ours, theirs in (("input", "prompt_tokens"), ("output", "completion_tokens"))
        if isinstance(counts.get(theirs), int)
    }
    return (answers[0] if len(answers) == 1 else answers), usage


def _last_answer(trajectory: Trajectory) -> Any:
    messages = trajectory.messages()
    return messages[-1] if messages else None


__all__ = ["chat_trace", "rollout_trace", "wait_for_connection_check"]
