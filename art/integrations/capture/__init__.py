"""Zero-code capture: the chat completions a rollout makes, recorded into a Trajectory.

    async def rollout(scenario: str) -> None:
        client = model.openai_client()
        ...  # any agent loop over that client
        art.auto_trajectory(required=True).reward = score(...)

    trajectory = await art.capture_auto_trajectory(rollout("..."))

Every chat completion for the trained model made inside the capture through a client
that carries a recording transport (`model.openai_client()`, `art.langgraph`'s chat
models, or any httpx-based client given `RecordingTransport`/`RecordingAsyncTransport`;
streamed or not, every choice when `n > 1`) is recorded with its request messages and
tools and the returned choices, our endpoint's token ids and logprobs included, so the
trajectory trains as if it had been built by hand. Calls to other models (a judge, a
tool's own LLM) and clients without the transport are not recorded: nothing of httpx is
patched. An agent that makes its own client gives it `http_client=art.capture_http_client()`;
a capture that recorded no call at all raises, naming that fix, rather than returning an
empty trajectory. How calls become conversations is described in `_assemble`; how they are
recorded, in `art.core.capture.recording`.

ART 0.5.23's capture scope (`with art.Trajectory() as t:`, `art.trajectory(...)`) records
through the same hooks into `t.exchanges`, in four protocols: `capture_http_client()`,
`capture_sync_http_client()`, `capture_trace_config()` (aiohttp) and
`capture_requests_session()` give clients that carry them (see `art.core.capture.capture_scope`).

`yield_trajectory` / `capture_yielded_trajectory` are the other ART pattern: code deep
inside a rollout hands its finished trajectory up, instead of returning it.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal, overload

import httpx

from ...core.capture.recording import RecordingAsyncTransport, RecordingTransport
from ...core.data.errors import ArtValueError, RolloutError
from ...core.data.trajectories import Trajectory
from ...core.openai_http import pool_limits
from ._assemble import conversations, fill
from ._recorder import RecordedCall, Recorder, current_recorder, recording

if TYPE_CHECKING:
    import aiohttp
    import requests

_auto: ContextVar[Trajectory | None] = ContextVar("art_auto_trajectory", default=None)
_yielded: ContextVar[list[Trajectory] | None] = ContextVar("art_yielded_trajectory", default=None)


@overload
def auto_trajectory(*, required: Literal[True]) -> Trajectory: ...


@overload
def auto_trajectory(*, required: bool = False) -> Trajectory | None: ...


def auto_trajectory(*, required: bool = False) -> Trajectory | None:
    """The trajectory being captured by the enclosing `capture_auto_trajectory`, if any.

    Set its reward, metrics and metadata inside the rollout; its messages fill in as the
    rollout's chat completions finish. With `required=True`, outside a capture raises.
    """
    trajectory = _auto.get()
    if trajectory is None and required:
        raise RolloutError(
            "auto_trajectory(required=True) was called outside a capture. "
            "Run the rollout as `await art.capture_auto_trajectory(rollout(...))`"
        )
    return trajectory


async def capture_auto_trajectory(coroutine: Awaitable[Any]) -> Trajectory:
    """Run `coroutine` and return the Trajectory of the chat completions it made.

    Its `messages_and_choices`, `tools` and `additional_histories` are the recorded
    conversations; reward, metrics and metadata are whatever the rollout set through
    `auto_trajectory()`. `metrics['duration']` is the capture's wall time. Responses
    that could not be read are noted in `logs`, never dropped silently. A rollout that
    sent no chat completion through a recording client (an `AsyncOpenAI` it made
    without `http_client=art.capture_http_client()`, say) raises `RolloutError`.
    """
    if not inspect.isawaitable(coroutine):
        raise ArtValueError(
            "coroutine",
            f"expected an awaitable, got {type(coroutine).__name__}",
            "Pass the call, not the function: `capture_auto_trajectory(rollout(scenario))`",
        )
    trajectory = Trajectory()
    lock = threading.Lock()  # sync clients record from executor threads

    def refresh(recorder: Recorder) -> None:
        with lock:
            fill(trajectory, recorder.calls())

    recorder = Recorder(on_record=refresh)
    token = _auto.set(trajectory)
    try:
        with recording(recorder):
            await coroutine
    finally:
        _auto.reset(token)
    refresh(recorder)
    if recorder.sent == 0 and not trajectory.messages_and_choices:
        raise RolloutError(
            "capture_auto_trajectory recorded no chat completion, so the trajectory would be "
            "empty. Calls are recorded only through clients that carry the recording "
            "transport (nothing of httpx is patched): make the client with "
            "`model.openai_client()`, or give your own one "
            "`AsyncOpenAI(base_url=..., api_key=..., http_client=art.capture_http_client())`"
        )
    trajectory.logs.extend(recorder.problems)
    return trajectory.finish()


def capture_http_client() -> httpx.AsyncClient:
    """An HTTP client that records the model calls sent through it inside a capture.

    Give it to a client the agent makes itself:
    `AsyncOpenAI(base_url=..., api_key=..., http_client=art.capture_http_client())`,
    `AsyncAnthropic(..., http_client=...)`, LangChain's `ChatOpenAI(...,
    http_async_client=...)`. Inside `with art.Trajectory() as t:` every Chat Completions,
    Completions, Responses and Messages call through it is added to `t.exchanges`; inside
    `capture_auto_trajectory` (and `art.langgraph`'s wrapped rollouts) every chat
    completion is recorded, whichever model it names. Outside both it is a plain client,
    with the OpenAI SDK's timeout and pool limits.

    It is an httpx2 client where httpx2 is installed (the fork of httpx that OpenAI's SDK 3
    and Anthropic's SDK 2 are built on; Anthropic's takes nothing else), else an httpx one:
    both have httpx's API.
    """
    client: httpx.AsyncClient = _recording_client(sync=False)
    return client


def capture_sync_http_client() -> httpx.Client:
    """The sync twin of `capture_http_client`: `OpenAI(..., http_client=...)`,
    `Anthropic(..., http_client=...)`."""
    client: httpx.Client = _recording_client(sync=True)
    return client


def _recording_client(*, sync: bool) -> Any:
    """An httpx2 client (httpx where httpx2 is missing) on a recording transport, with the
    OpenAI SDK's timeout and pool limits. httpx2 keeps httpx's API on classes of its own,
    so the one module's names build it whole."""
    http: Any
    recording: tuple[Any, Any]  # the sync and the async transport
    try:
        import httpx2
    except ImportError:
        http, recording = httpx, (RecordingTransport, RecordingAsyncTransport)
    else:
        from ...core.capture.recording_httpx2 import (
            Httpx2RecordingAsyncTransport,
            Httpx2RecordingTransport,
        )

        http, recording = httpx2, (Httpx2RecordingTransport, Httpx2RecordingAsyncTransport)
    limits = pool_limits(http)
    transport: Any
    if sync:
        transport, client = recording[0](http.HTTPTransport(limits=limits)), http.Client
    else:
        transport, client = recording[1](http.AsyncHTTPTransport(limits=limits)), http.AsyncClient
    return client(
        transport=transport, timeout=http.Timeout(600.0, connect=5.0), follow_redirects=True
    )


def capture_trace_config() -> aiohttp.TraceConfig:
    """An aiohttp trace config recording model calls made inside a capture scope:
    `aiohttp.ClientSession(trace_configs=[art.capture_trace_config()])`."""
    from .aiohttp import capture_trace_config as trace_config

    return trace_config()


def capture_requests_session() -> requests.Session:
    """A `requests.Session` recording model calls made inside a capture scope (its
    `CaptureAdapter` mounted for http:// and https://)."""
    from .requests import capture_requests_session as session

    return session()


def yield_trajectory(trajectory: Trajectory) -> None:
    """Hand `trajectory` to the enclosing `capture_yielded_trajectory`.

    As in ART, outside such a capture this does nothing, so the same rollout code also
    runs on its own.
    """
    if not isinstance(trajectory, Trajectory):
        raise ArtValueError(
            "trajectory",
            f"expected an art.Trajectory, got {type(trajectory).__name__}",
            "Yield the Trajectory the rollout built",
        )
    slot = _yielded.get()
    if slot is not None:
        slot[:] = [trajectory]


async def capture_yielded_trajectory(coroutine: Awaitable[Any]) -> Trajectory:
    """Run `coroutine` and return the last trajectory it passed to `yield_trajectory`."""
    if not inspect.isawaitable(coroutine):
        raise ArtValueError(
            "coroutine",
            f"expected an awaitable, got {type(coroutine).__name__}",
            "Pass the call, not the function: `capture_yielded_trajectory(rollout(scenario))`",
        )
    slot: list[Trajectory] = []
    token = _yielded.set(slot)
    try:
        await coroutine
    finally:
        _yielded.reset(token)
    if not slot:
        raise RolloutError(
            "the rollout finished without yielding a trajectory. "
            "Call `art.yield_trajectory(trajectory)` inside it before it returns"
        )
    return slot[0]


__all__ = [
    "RecordedCall",
    "Recorder",
    "RecordingAsyncTransport",
    "RecordingTransport",
    "auto_trajectory",
    "capture_auto_trajectory",
    "capture_http_client",
    "capture_requests_session",
    "capture_sync_http_client",
    "capture_trace_config",
    "capture_yielded_trajectory",
    "conversations",
    "current_recorder",
    "fill",
    "recording",
    "yield_trajectory",
]
