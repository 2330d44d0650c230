"""A streamed chat completion, read chunk by chunk, made into the `ChatCompletion` a call
without `stream=True` returns (ART's `art.openai` helpers). Each message delta is merged
by `merge_chat_delta`, as the capture pipeline merges a recorded stream's.

Our endpoint's extra fields on each streamed choice (`token_ids`, `token_logprobs`, ...)
are kept on the finished choices, lists concatenated and `prompt_token_ids` taken once, so
a completion read from a stream trains as one read whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from openai import AsyncStream, Stream
from openai.types.chat.chat_completion import ChatCompletion, Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import ChatCompletionChunk
from openai.types.chat.chat_completion_message import ChatCompletionMessage

from ...core.capture.chat_deltas import finished_chat_message, merge_chat_delta


class IncompleteChatCompletionStreamError(ValueError):
    """The stream ended with no choice, or before every choice had its finish reason."""


def init_chat_completion(chunk: ChatCompletionChunk) -> ChatCompletion:
    """An empty completion with the first chunk's id, model and choices; fill it with
    `update_chat_completion` (the first chunk included)."""
    return ChatCompletion(
        id=chunk.id,
        created=chunk.created,
        model=chunk.model,
        object="chat.completion",
        choices=[_empty_choice(part.index) for part in chunk.choices],
    )


def _empty_choice(index: int) -> Choice:
    message = ChatCompletionMessage(role="assistant")
    return Choice(index=index, finish_reason="stop", logprobs=None, message=message)


def update_chat_completion(completion: ChatCompletion, chunk: ChatCompletionChunk) -> None:
    """Add one chunk to `completion`: text, refusal and tool-call pieces, logprobs, the
    finish reason, `usage`, and the endpoint's extra fields per choice."""
    if chunk.usage is not None:
        completion.usage = chunk.usage
    for key, value in (chunk.model_extra or {}).items():
        _extend_extra(completion, key, value)
    choices = {choice.index: choice for choice in completion.choices}
    for part in chunk.choices:
        choice = choices.get(part.index)
        if choice is None:
            choice = choices[part.index] = _empty_choice(part.index)
            completion.choices.append(choice)
        if part.finish_reason is not None:
            choice.finish_reason = part.finish_reason
        message = choice.message.model_dump(exclude_none=True)
        delta = part.delta.model_dump(exclude_none=True)
        merge_chat_delta(message, {key: value for key, value in delta.items() if value != ""})
        choice.message = ChatCompletionMessage.model_validate(finished_chat_message(message))
        if part.logprobs is not None:
            logprobs = choice.logprobs or ChoiceLogprobs()
            if part.logprobs.content is not None:
                logprobs.content = [*(logprobs.content or []), *part.logprobs.content]
            if part.logprobs.refusal is not None:
                logprobs.refusal = [*(logprobs.refusal or []), *part.logprobs.refusal]
            choice.logprobs = logprobs
        for key, value in (part.model_extra or {}).items():
            _extend_extra(choice, key, value)


def _extend_extra(model: ChatCompletion | Choice, key: str, value: Any) -> None:
    extra = model.model_extra
    assert extra is not None  # openai's models keep unknown fields
    if isinstance(value, list) and isinstance(extra.get(key), list):
        if key != "prompt_token_ids":  # sent whole once (or again): not a delta
            extra[key] = extra[key] + value
    else:
        extra[key] = value


def finalize_chat_completion(completion: ChatCompletion) -> ChatCompletion:
    """`completion`, with `prompt_token_ids` sent at the top level of the chunks copied onto
    each choice that lacks it (where a server sends it once for the whole stream)."""
    prompt = (completion.model_extra or {}).get("prompt_token_ids")
    if prompt is not None:
        for choice in completion.choices:
            assert choice.model_extra is not None
            choice.model_extra.setdefault("prompt_token_ids", prompt)
    return completion


def _finished(
    completion: ChatCompletion | None,
    finished: set[int],
    *,
    stopped_early: bool = False,
    require_usage: bool = False,
) -> ChatCompletion:
    if completion is None or not completion.choices:
        raise IncompleteChatCompletionStreamError("the stream held no choice")
    unfinished = sorted({choice.index for choice in completion.choices} - finished)
    if unfinished and not stopped_early:
        raise IncompleteChatCompletionStreamError(
            f"the stream ended before choices {unfinished} finished"
        )
    if require_usage and completion.usage is None:
        raise IncompleteChatCompletionStreamError(
            'the stream ended without usage: ask for it with stream_options={"include_usage": True}'
        )
    return finalize_chat_completion(completion)


async def consume_chat_completion_stream(
    stream: AsyncStream[ChatCompletionChunk],
    on_chunk: Callable[[ChatCompletionChunk, ChatCompletion], Any] | None = None,
    *,
    require_usage: bool = False,
) -> ChatCompletion:
    """Read `stream` to its end and return the completion it streamed.

    `on_chunk(chunk, completion_so_far)` is called after each chunk; raising
    `StopIteration` there closes the stream and returns what arrived (unfinished choices
    allowed). `require_usage` refuses a stream that ends without `usage`. Raises
    `IncompleteChatCompletionStreamError` for a stream with no choice or one cut short.
    """
    completion: ChatCompletion | None = None
    finished: set[int] = set()
    try:
        async for chunk in stream:
            if completion is None:
                completion = init_chat_completion(chunk)
            update_chat_completion(completion, chunk)
            finished.update(p.index for p in chunk.choices if p.finish_reason is not None)
            if on_chunk is not None:
                try:
                    on_chunk(chunk, completion)
                except StopIteration:
                    await stream.close()
                    return _finished(completion, finished, stopped_early=True)
        return _finished(completion, finished, require_usage=require_usage)
    except BaseException:
        await stream.close()
        raise


def consume_sync_chat_completion_stream(stream: Stream[ChatCompletionChunk]) -> ChatCompletion:
    """`consume_chat_completion_stream` for a synchronous client's stream."""
    completion: ChatCompletion | None = None
    finished: set[int] = set()
    try:
        for chunk in stream:
            if completion is None:
                completion = init_chat_completion(chunk)
            update_chat_completion(completion, chunk)
            finished.update(p.index for p in chunk.choices if p.finish_reason is not None)
        return _finished(completion, finished)
    except BaseException:
        stream.close()
        raise


__all__ = [
    "IncompleteChatCompletionStreamError",
    "consume_chat_completion_stream",
    "consume_sync_chat_completion_stream",
    "finalize_chat_completion",
    "init_chat_completion",
    "update_chat_completion",
]
