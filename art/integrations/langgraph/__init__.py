"""Train the model behind an existing LangGraph agent: change where the chat model is made.

    async def rollout(scenario: Scenario) -> art.Trajectory:
        graph = create_react_agent(init_chat_model(), tools)   # was: ChatOpenAI(...)
        result = await graph.ainvoke({"messages": [("user", scenario.question)]})
        return art.Trajectory(reward=score(result, scenario))

    trajectory = await wrap_rollout(model, rollout)(scenario)

`wrap_rollout` runs the rollout with a per-rollout recorder (a contextvar, so rollouts
run concurrently, and parallel graph nodes record into their own rollout); every chat
completion the graph makes through `init_chat_model` models is recorded with its token
ids, and the conversations are put into the trajectory the rollout returns.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, ParamSpec

from ...core.data.errors import ArtValueError, RolloutError
from ...core.data.trajectories import Trajectory
from ...core.model import Model
from ..capture import Recorder, current_recorder, fill, recording

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI

P = ParamSpec("P")


def init_chat_model(
    model: Model | None = None,
    *,
    temperature: float = 1.0,
    max_tokens: int | None = None,
    **kwargs: Any,
) -> ChatOpenAI:
    """A LangChain chat model (`ChatOpenAI`) for `model`'s endpoint, recording its calls.

    Without `model`, the model of the rollout `wrap_rollout` is running. Temperature 1
    samples as training assumes. Its calls are recorded into whichever wrapped rollout
    makes them. `with_structured_output` uses tool calling by default (our endpoint
    forces the named tool). Other keyword arguments go to `ChatOpenAI`.
    """
    if model is None:
        recorder = current_recorder()
        model = recorder.model if recorder is not None else None
        if model is None:
            raise RolloutError(
                "init_chat_model() without a model must run inside a rollout wrapped with "
                "`art.langgraph.wrap_rollout(model, rollout)`; or pass the model: "
                "`init_chat_model(model)`"
            )
    if model.inference_base_url is None:
        model.openai_client()  # raises the error that says why this model has no endpoint
    import httpx

    from ...core.capture.recording import RecordingAsyncTransport, RecordingTransport, served_as
    from ._chat_model import ArtChatOpenAI

    accepts = served_as(model)

    return ArtChatOpenAI(
        model=model.get_inference_name(),
        base_url=model.inference_base_url,
        api_key=model.inference_api_key or "none",
        temperature=temperature,
        max_tokens=max_tokens,
        logprobs=True,
        http_client=httpx.Client(transport=RecordingTransport(accepts=accepts)),
        http_async_client=httpx.AsyncClient(transport=RecordingAsyncTransport(accepts=accepts)),
        # A CPU engine sends a tool-calling turn whole when it is done, after a silence
        # longer than LangChain's default wait between streamed chunks.
        **{"stream_chunk_timeout": None, **kwargs},
    )


def wrap_rollout(
    model: Model, fn: Callable[P, Awaitable[Trajectory]]
) -> Callable[P, Coroutine[Any, Any, Trajectory]]:
    """`fn` as a rollout whose LangGraph LLM calls fill the Trajectory it returns.

    `fn` builds and returns a Trajectory with its reward (and metrics, metadata), leaving
    the messages empty: the first recorded conversation becomes its
    `messages_and_choices` and `tools`, the others are appended to its
    `additional_histories`. Responses that could not be read are noted in its `logs`.
    """
    if not isinstance(model, Model):
        raise ArtValueError(
            "model",
            f"expected an art.Model, got {type(model).__name__}",
            "Call wrap_rollout(model, rollout) with the model being trained",
        )

    @functools.wraps(fn)
    async def rollout(*args: P.args, **kwargs: P.kwargs) -> Trajectory:
        recorder = Recorder(model=model)
        with recording(recorder):
            trajectory = await fn(*args, **kwargs)
        if not isinstance(trajectory, Trajectory):
            raise RolloutError(
                f"{getattr(fn, '__name__', 'the rollout')} returned "
                f"{type(trajectory).__name__}; a wrapped rollout must return an "
                "art.Trajectory (with its reward), whose messages wrap_rollout fills in"
            )
        if trajectory.messages_and_choices:
            raise RolloutError(
                "the wrapped rollout returned a Trajectory that already holds messages; "
                "wrap_rollout fills them from the recorded LLM calls. Return "
                "art.Trajectory(reward=...) without messages, or do not wrap the rollout"
            )
        fill(trajectory, recorder.calls(), keep=len(trajectory.additional_histories))
        trajectory.logs.extend(recorder.problems)
        return trajectory

    return rollout


__all__ = ["init_chat_model", "wrap_rollout"]
