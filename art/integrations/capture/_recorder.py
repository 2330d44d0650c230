"""The per-rollout recording: which chat completions a rollout made, in the order it made them."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from openai.types.chat.chat_completion import Choice
from pydantic import ValidationError

from ...core.capture.exchange_capture import assemble_chat_stream
from ...core.capture.recording import current_sink, recording_into

if TYPE_CHECKING:
    from ...core.model import Model


@dataclass(frozen=True)
class RecordedCall:
    """One sampled choice of a chat completion, and what was sent for it.

    A request with `n > 1` is recorded as one call per choice, all with the same `order`.
    """

    order: int  # when the request was sent, relative to the rollout's other calls
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    choice: Choice


class Recorder:
    """The chat completions of one rollout.

    Requests from several threads (sync LangChain calls run in executors) or tasks
    (parallel graph nodes) may record at once, so the list is guarded by a lock.
    `model` is the model a LangGraph rollout was wrapped for (None for plain capture);
    `on_record` runs after each call is recorded.
    """

    def __init__(
        self,
        model: Model | None = None,
        on_record: Callable[[Recorder], None] | None = None,
    ) -> None:
        self.model = model
        self.problems: list[str] = []  # responses that could not be read, kept for the logs
        self._on_record = on_record
        self._calls: list[RecordedCall] = []
        self._sent = 0
        self._lock = threading.Lock()

    def start(self) -> int:
        """Number a request as it is sent; calls are ordered by this, not by when they end."""
        with self._lock:
            self._sent += 1
            return self._sent

    @property
    def sent(self) -> int:
        """How many chat completions went out through a recording transport so far."""
        with self._lock:
            return self._sent

    def add(self, order: int, request: dict[str, Any], body: bytes) -> None:
        """Record a finished call from its request JSON and its response body (JSON or SSE).

        Every choice is recorded (`n > 1` samples the prompt n times, each trainable).
        """
        try:
            if request.get("stream"):
                choices = [Choice.model_validate(c) for c in assemble_chat_stream(body)[1]]
            else:
                raw = json.loads(body)["choices"]
                choices = [Choice.model_validate(choice) for choice in raw]
                if not choices:
                    raise ValueError("the response holds no choice")
        except (ValueError, KeyError, IndexError, TypeError, ValidationError) as error:
            # A response the client itself could read but we cannot: keep the rollout, note it.
            with self._lock:
                self.problems.append(f"capture: call {order} not recorded: {error}")
            return
        messages, tools = list(request["messages"]), request.get("tools")
        calls = [RecordedCall(order, messages, tools, choice) for choice in choices]
        with self._lock:
            self._calls.extend(calls)
        if self._on_record is not None:
            self._on_record(self)

    def calls(self) -> list[RecordedCall]:
        """The recorded calls in the order they were sent."""
        with self._lock:
            return sorted(self._calls, key=lambda call: call.order)  # stable: choices in order


def current_recorder() -> Recorder | None:
    """The recorder of the rollout this code runs in, if any."""
    sink = current_sink()
    return sink if isinstance(sink, Recorder) else None


@contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Record the chat completions made in this context (and tasks started from it)."""
    with recording_into(recorder):
        yield recorder
