"""One model call recorded as an exchange of the capture scope it was made in.

A client hook (the httpx transports in `recording`, the aiohttp trace config and the
requests adapter in `art.integrations.capture`) calls `begin` as a request goes out. It
answers an `ExchangeCapture` when the request is a JSON POST to one of the four protocols'
paths made inside `with art.Trajectory() as t:` (and not hidden by `art.no_capture()`),
else None. The hook then hands it the status, the body's bytes as the client reads them,
and says when the body ended or was cut short. The exchange is built and appended to the
trajectory once: when the body ends, or, for a stream, when its terminal event arrives
(a client may stop reading there). A cut body, a body that cannot be parsed, or a
trajectory built by hand (which cannot hold exchanges) leaves a line in `t.logs` instead.

Nothing here raises into the client: what the client receives is never changed.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from ..data.exchanges import (
    ChatCompletionsExchange,
    CompletionsExchange,
    Exchange,
    MessagesExchange,
    ResponsesExchange,
    utc_now,
)
from . import capture_scope
from .chat_deltas import finished_chat_message, merge_chat_delta

if TYPE_CHECKING:
    from ..data.trajectories import Trajectory

ExchangeProtocol = Literal["chat_completions", "completions", "responses", "messages"]

# Longest first: "/chat/completions" also ends with "/completions".
_PATHS: tuple[tuple[str, ExchangeProtocol], ...] = (
    ("/chat/completions", "chat_completions"),
    ("/completions", "completions"),
    ("/responses", "responses"),
    ("/messages", "messages"),
)


def protocol_for_url(url: str) -> ExchangeProtocol | None:
    """The protocol a POST to `url` speaks, by its path's end (any host, any prefix)."""
    path = urlsplit(url).path.rstrip("/")
    return next((protocol for suffix, protocol in _PATHS if path.endswith(suffix)), None)


def request_json(body: object) -> dict[str, Any] | None:
    """The JSON object a request body holds, or None for any other body."""
    if isinstance(body, str):
        body = body.encode()
    if not isinstance(body, bytes | bytearray | memoryview):
        return None
    try:
        value = json.loads(bytes(body))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


# --- server-sent events -----------------------------------------------------------------

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")

SseEvent = tuple[str | None, str]  # (the `event:` name, the joined `data:` lines)


def _parse_block(block: bytes) -> SseEvent | None:
    name: str | None = None
    data: list[str] = []
    for line in block.decode("utf-8").splitlines():
        field, colon, value = line.partition(":")
        if not colon:
            continue
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    return (name, "\n".join(data)) if data else None


def sse_events(body: bytes) -> list[SseEvent]:
    """The complete events of an SSE body, in order (a trailing partial event is left out)."""
    events: list[SseEvent] = []
    start = 0
    for end in _EVENT_END.finditer(body):
        event = _parse_block(body[start : end.start()])
        start = end.end()
        if event is not None:
            events.append(event)
    return events


def _sse_json(body: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """The JSON object events of a stream; `[DONE]` and keep-alive texts are left out."""
    events: list[tuple[str | None, dict[str, Any]]] = []
    for name, data in sse_events(body):
        if data == "[DONE]":
            continue
        try:
            value = json.loads(data)
        except ValueError:
            if data.strip().lower() in ("ping", "keepalive", ""):
                continue
            raise
        if isinstance(value, dict):
            events.append((name, value))
    return events


def is_terminal_event(protocol: ExchangeProtocol, event: SseEvent) -> bool:
    """Whether `event` is the last one a stream of `protocol` sends with its answer."""
    name, data = event
    if protocol in ("chat_completions", "completions"):
        return data == "[DONE]"
    terminal = (
        ("response.completed", "response.incomplete", "response.failed")
        if protocol == "responses"
        else ("message_stop",)
    )
    if name in terminal:
        return True
    try:
        value = json.loads(data)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("type") in terminal


class SseScan:
    """The events of an SSE body read as it arrives: `new(body)`, called as `body` grows,
    returns the events completed since the last call. An event that is not UTF-8 is
    passed over (a whole body's `sse_events` raises instead)."""

    def __init__(self) -> None:
        self._event_start = 0  # where the event being received begins in the body
        self._search_from = 0

    def new(self, body: bytes | bytearray) -> list[SseEvent]:
        events: list[SseEvent] = []
        while True:
            end = _EVENT_END.search(body, self._search_from)
            if end is None:
                # A delimiter may straddle two chunks: search again from just before the end.
                self._search_from = max(self._event_start, len(body) - 3)
                return events
            block = bytes(body[self._event_start : end.start()])
            self._event_start = self._search_from = end.end()
            try:
                event = _parse_block(block)
            except UnicodeDecodeError:
                continue
            if event is not None:
                events.append(event)


class _TerminalScan:
    """Watches a stream's bytes as they arrive for the protocol's terminal event."""

    def __init__(self, protocol: ExchangeProtocol) -> None:
        self._protocol = protocol
        self._scan = SseScan()

    def reached(self, body: bytearray) -> bool:
        return any(is_terminal_event(self._protocol, event) for event in self._scan.new(body))


# --- response bodies, per protocol ------------------------------------------------------


def _merge_extras(into: dict[str, Any], part: dict[str, Any], standard: set[str]) -> None:
    # Our endpoint's fields (and any other server's): lists arrive in pieces and are
    # concatenated, except the prompt's ids, which every piece may repeat whole.
    for key, value in part.items():
        if key in standard:
            continue
        if isinstance(value, list) and isinstance(into.get(key), list):
            if key != "prompt_token_ids":
                into[key] = into[key] + value
        else:
            into[key] = value


_CHAT_CHOICE = {"index", "delta", "finish_reason", "logprobs"}
_COMPLETION_CHOICE = {"index", "text", "finish_reason", "logprobs"}
_TOP = {"choices", "object", "usage"}


def _streamed_choices(
    body: bytes,
    empty: Callable[[int], dict[str, Any]],
    add: Callable[[dict[str, Any], dict[str, Any]], None],
    standard: set[str],
    *,
    finished: bool = True,
) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """The chunks of a choices stream (Chat Completions, Completions) put together: their
    top-level fields, and each choice by index, begun by `empty(index)` and grown by
    `add(choice, piece)` for each piece of it; the piece's fields outside `standard` are
    an endpoint's extras, kept on the choice. With `finished`, every choice must have
    finished."""
    top: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    for _, chunk in _sse_json(body):
        if "error" in chunk and "choices" not in chunk:
            raise ValueError(f"the stream sent an error: {chunk['error']}")
        for key, value in chunk.items():
            if key not in _TOP and (value is not None or key not in top):
                top[key] = value
        if chunk.get("usage") is not None:
            top["usage"] = chunk["usage"]
        for part in chunk.get("choices") or []:
            index = part.get("index", 0)
            choice = choices.setdefault(index, empty(index))
            add(choice, part)
            choice["finish_reason"] = part.get("finish_reason") or choice["finish_reason"]
            _merge_extras(choice, part, standard)
    if not choices:
        raise ValueError("the stream held no choice")
    unfinished = sorted(index for index, choice in choices.items() if not choice["finish_reason"])
    if unfinished and finished:
        raise ValueError(f"the stream ended before choices {unfinished} finished")
    return top, choices


def _chat_completion(body: bytes, *, stream: bool) -> ChatCompletion:
    if not stream:
        return ChatCompletion.model_validate_json(body)
    top, choices = assemble_chat_stream(body)
    return ChatCompletion.model_validate({**top, "object": "chat.completion", "choices": choices})


def assemble_chat_stream(
    body: bytes, *, finished: bool = True
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A streamed chat completion (its SSE body) put back together: the chunks' top-level
    fields, and each choice (`n > 1` streams them interleaved) as a `Choice`'s data, by
    index. Each delta is merged by `chat_deltas.merge_chat_delta` (text concatenates,
    tool calls merge by their index), logprobs concatenate; an endpoint's extra fields are kept on the choice (`prompt_token_ids`
    once, other lists concatenated). ValueError for a stream that sent an error, held
    no choice, or (with `finished`, for training) ended before a choice finished; an
    observer passes `finished=False` to see what arrived."""

    def empty(index: int) -> dict[str, Any]:
        message = {"role": "assistant"}
        return {"index": index, "message": message, "finish_reason": None, "logprobs": None}

    def add(choice: dict[str, Any], part: dict[str, Any]) -> None:
        # Empty text adds nothing: a tool call's message keeps `content: null`, as whole.
        delta = {key: value for key, value in (part.get("delta") or {}).items() if value != ""}
        pieces = delta.get("tool_calls")
        if isinstance(pieces, list):  # a piece without an index is a call of its own
            known = len(choice["message"].get("tool_calls") or [])
            delta["tool_calls"] = [
                piece if "index" in piece else {**piece, "index": known + i}
                for i, piece in enumerate(pieces)
            ]
        merge_chat_delta(choice["message"], delta)
        logprobs = part.get("logprobs")
        if isinstance(logprobs, dict):
            merged = choice["logprobs"] or {"content": None, "refusal": None}
            for key in ("content", "refusal"):
                if logprobs.get(key) is not None:
                    merged[key] = (merged[key] or []) + list(logprobs[key])
            choice["logprobs"] = merged

    top, choices = _streamed_choices(body, empty, add, _CHAT_CHOICE, finished=finished)
    for choice in choices.values():
        choice["message"] = finished_chat_message(choice["message"])
    return top, [choices[i] for i in sorted(choices)]


def _completion(body: bytes, *, stream: bool) -> Completion:
    if not stream:
        return Completion.model_validate_json(body)

    def empty(index: int) -> dict[str, Any]:
        return {"index": index, "text": "", "finish_reason": None, "logprobs": None}

    def add(choice: dict[str, Any], part: dict[str, Any]) -> None:
        choice["text"] += part.get("text") or ""
        logprobs = part.get("logprobs")
        if isinstance(logprobs, dict):
            merged = choice["logprobs"] or {}
            for key, value in logprobs.items():
                if isinstance(value, list):
                    merged[key] = (merged.get(key) or []) + value
                elif value is not None:
                    merged[key] = value
            choice["logprobs"] = merged

    top, choices = _streamed_choices(body, empty, add, _COMPLETION_CHOICE)
    return Completion.model_validate(
        {**top, "object": "text_completion", "choices": [choices[i] for i in sorted(choices)]}
    )


def _response(body: bytes, *, stream: bool) -> Response:
    if not stream:
        return Response.model_validate_json(body)
    final: dict[str, Any] | None = None
    for name, event in _sse_json(body):
        kind = event.get("type") or name
        if kind == "error" or kind == "response.failed":
            raise ValueError(f"the stream ended in {kind}: {event}")
        if kind in ("response.completed", "response.incomplete"):
            response = event.get("response")
            if isinstance(response, dict):
                final = response
    if final is None:
        raise ValueError("the stream ended before its response.completed event")
    return Response.model_validate(final)


_MESSAGE_DELTA_EVENT = {"type", "delta", "usage", "index"}


def _message(body: bytes, *, stream: bool) -> dict[str, Any]:
    """The Messages answer as a dict (validated into anthropic's `Message` by the exchange)."""
    if not stream:
        value = json.loads(body)
        if not isinstance(value, dict):
            raise ValueError("the body is not a JSON object")
        return value
    message: dict[str, Any] | None = None
    partial_json: dict[int, str] = {}
    stopped = False
    for name, event in _sse_json(body):
        kind = event.get("type") or name
        if kind == "ping":
            continue
        if kind == "error":
            raise ValueError(f"the stream sent an error: {event.get('error')}")
        if kind == "message_start":
            message = dict(event["message"])
            message["content"] = list(message.get("content") or [])
            continue
        if message is None:
            raise ValueError(f"the stream sent {kind} before message_start")
        content: list[dict[str, Any]] = message["content"]
        if kind == "content_block_start":
            index = event["index"]
            while len(content) <= index:
                content.append({})
            content[index] = dict(event["content_block"])
        elif kind == "content_block_delta":
            block, delta = content[event["index"]], event["delta"]
            delta_type = delta.get("type")
            if delta_type == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
            elif delta_type == "input_json_delta":
                partial_json[event["index"]] = (
                    partial_json.get(event["index"], "") + delta["partial_json"]
                )
            elif delta_type == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta["thinking"]
            elif delta_type == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta_type == "citations_delta":
                block["citations"] = [*(block.get("citations") or []), delta["citation"]]
        elif kind == "content_block_stop":
            text = partial_json.pop(event["index"], None)
            if text is not None:
                content[event["index"]]["input"] = json.loads(text) if text.strip() else {}
        elif kind == "message_delta":
            message.update(event.get("delta") or {})
            usage = event.get("usage") or {}
            merged = dict(message.get("usage") or {})
            merged.update({key: value for key, value in usage.items() if value is not None})
            message["usage"] = merged
            # Our endpoint's token ids and other extension fields ride at the event's top.
            _merge_extras(message, event, _MESSAGE_DELTA_EVENT)
        elif kind == "message_stop":
            stopped = True
    if message is None or not stopped:
        raise ValueError("the stream ended before its message_stop event")
    return message


def build_exchange(
    protocol: ExchangeProtocol,
    request: dict[str, Any],
    body: bytes,
    *,
    start_time: datetime,
    end_time: datetime,
) -> Exchange:
    """The typed exchange of one call from its request JSON and response body (JSON or SSE).

    Raises ValueError (pydantic's ValidationError among them), or KeyError or TypeError for
    malformed events, for a body that is not a complete answer of `protocol`.
    """
    stream = request.get("stream") is True
    times = {"request": request, "start_time": start_time, "end_time": end_time}
    if protocol == "chat_completions":
        return ChatCompletionsExchange(response=_chat_completion(body, stream=stream), **times)
    if protocol == "completions":
        return CompletionsExchange(response=_completion(body, stream=stream), **times)
    if protocol == "responses":
        return ResponsesExchange(response=_response(body, stream=stream), **times)
    return MessagesExchange(response=_message(body, stream=stream), **times)


# --- one call being recorded ------------------------------------------------------------

_append_lock = threading.Lock()  # sync clients record from threads into shared trajectories


def append_exchange(trajectory: Trajectory, exchange: Exchange) -> None:
    """Append `exchange` to `trajectory`, or say in its logs why it cannot hold one."""
    with _append_lock:
        if (
            trajectory.messages_and_choices
            or trajectory.tools is not None
            or trajectory.additional_histories
        ):
            # As ART, a trajectory built by hand holds no exchanges; unlike ART, say so.
            trajectory.logs.append(
                f"{_describe(exchange)} was not recorded: this trajectory has "
                "messages_and_choices, tools or additional_histories, and a trajectory holds "
                "either those or captured exchanges. Enter an empty `art.Trajectory()` to "
                "capture calls"
            )
            return
        trajectory.exchanges.add(exchange)


def _describe(exchange: Exchange) -> str:
    kind = type(exchange).__name__.removesuffix("Exchange")
    return f"a {kind} exchange with model {exchange.model!r}"


class ExchangeCapture:
    """A call being recorded: its request, and its response body as the client reads it.

    The hook calls `responded(status)`, then `feed` with each piece of the body, then
    `ended()` when the client read it to its end or `cut(why)` when the response was
    closed first; any of them may come more than once, and after the exchange is appended
    (or given up) the rest do nothing. `decode` turns the bytes fed into the body's
    content (a transport sees them still compressed); `scan` looks for a stream's
    terminal event in the bytes as fed, which needs them uncompressed.
    """

    def __init__(
        self,
        trajectory: Trajectory,
        protocol: ExchangeProtocol,
        request: dict[str, Any],
        path: str,
        *,
        start_time: datetime | None = None,
    ) -> None:
        self.trajectory = trajectory
        self.protocol = protocol
        self.request = request
        self.path = path
        self.start_time = start_time or utc_now()
        self.status: int | None = None
        self.decode: Callable[[bytes], bytes] | None = None
        self._body = bytearray()
        self._scan: _TerminalScan | None = (
            _TerminalScan(protocol) if request.get("stream") is True else None
        )
        self._done = False
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        """Whether the exchange was appended or given up; later calls do nothing."""
        return self._done

    def responded(self, status: int, *, scan: bool = True) -> None:
        """The response's status arrived; `scan=False` when its body comes compressed."""
        self.status = status
        if not scan:
            self._scan = None
        if not 200 <= status < 300:
            self._give_up()  # the client raises for it; nothing was sampled

    def feed(self, chunk: bytes) -> None:
        """A piece of the body, as the client read it."""
        if self._done or not chunk:
            return
        self._body.extend(chunk)
        if self._scan is not None and self._scan.reached(self._body):
            self.ended()

    def ended(self) -> None:
        """The body is complete: build the exchange and append it (once)."""
        if not self._claim():
            return
        try:
            raw = bytes(self._body)
            body = self.decode(raw) if self.decode is not None else raw
            exchange = build_exchange(
                self.protocol,
                self.request,
                body,
                start_time=self.start_time,
                end_time=utc_now(),
            )
        except Exception as error:  # any malformed body: logged, never raised into the client
            self._log(f"its response could not be read as {self.protocol} ({error!r})")
        else:
            append_exchange(self.trajectory, exchange)
        finally:
            self._body = bytearray()

    def cut(self, why: str = "the response was closed before its body ended") -> None:
        """The body will not complete: nothing is appended, and the logs say so."""
        if self._claim():
            self._body = bytearray()
            self._log(why)

    def _give_up(self) -> None:
        if self._claim():
            self._body = bytearray()

    def _claim(self) -> bool:
        with self._lock:
            if self._done:
                return False
            self._done = True
            return True

    def _log(self, why: str) -> None:
        with _append_lock:
            self.trajectory.logs.append(
                f"POST {self.path} (model {self.request.get('model')!r}) was not recorded: {why}"
            )


# Set while one hook sends a request it captures, so a hook of a library it sends through
# (an httpx transport over an aiohttp session, say) does not record the same call again.
_sending: ContextVar[bool] = ContextVar("art_exchange_capture_sending", default=False)


@contextmanager
def sending() -> Iterator[None]:
    """Around the call that sends a captured request: hooks beneath it record nothing."""
    token = _sending.set(True)
    try:
        yield
    finally:
        _sending.reset(token)


def target(method: str, url: str) -> tuple[Trajectory, ExchangeProtocol] | None:
    """The trajectory and protocol a request would be recorded as, before its body is known.

    None for anything but a POST to a model path inside a capture scope.
    """
    if method.upper() != "POST" or _sending.get():
        return None
    trajectory = capture_scope.current_trajectory()
    protocol = protocol_for_url(url)
    if trajectory is None or protocol is None:
        return None
    return trajectory, protocol


def begin(method: str, url: str, body: object) -> ExchangeCapture | None:
    """A capture of this request, if it is a JSON model call made inside a capture scope."""
    found = target(method, url)
    if found is None:
        return None
    request = request_json(body)
    if request is None:
        return None
    return ExchangeCapture(*found, request, urlsplit(url).path)


__all__ = [
    "ExchangeCapture",
    "ExchangeProtocol",
    "SseScan",
    "append_exchange",
    "begin",
    "build_exchange",
    "is_terminal_event",
    "protocol_for_url",
    "request_json",
    "sending",
    "sse_events",
    "target",
]
