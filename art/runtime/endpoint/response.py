"""What the endpoint answers: chat completions (streamed by `chat_stream`).

Each choice carries three fields beyond the OpenAI schema, which training reads:
`prompt_token_ids` (the exact prompt the engine saw), `token_ids` (the sampled tokens)
and `token_logprobs` (their logprobs under the model's temperature-1 distribution); and
a fourth, `policy_version`: the checkpoint step that sampled it (None: the base model).
A stream whose client goes away cancels its generation, so the engine drops its rows.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..chat_format import ChatRendering, parse_tool_calls, tool_call
from ..engines.base import Engine, Sample, SamplingParams
from ..engines.token_text import prefix_lengths
from .request import ChatCompletionRequest

logger = logging.getLogger("art.endpoint")


def no_release() -> None:
    """A route that holds nothing."""


@dataclass(frozen=True)
class Route:
    """Where a `model` name is served: an engine, and the adapter to use (None: the base).

    `release()` ends the route's hold on a leased checkpoint; the endpoint calls it once
    the request has ended, however it ended.
    """

    engine: Engine
    tokenizer: Any
    rendering: ChatRendering
    adapter: str | None
    context_length: int
    step: int | None = None  # the checkpoint step `adapter` holds; None: the base model
    release: Callable[[], None] = no_release


@dataclass(frozen=True)
class Job:
    """A request made ready for the engine: its prompt ids, sampling and tool policy."""

    prompt_ids: list[int]
    params: SamplingParams
    prefill: str  # assistant text forced before sampling (a required tool call)
    forced_tool: str | None  # the tool whose call the prefill opens
    tool_names: tuple[str, ...]  # the tools offered (none: no tool calls are parsed)

    @property
    def parse_tools(self) -> bool:
        return bool(self.tool_names)


class Router(Protocol):
    """Maps model names to routes (the model service is one)."""

    def route(self, model: str) -> Route:
        """The route for `model`; KeyError with a message naming what exists if none."""
        ...

    def model_names(self) -> list[str]: ...

    def longest_context(self) -> int:
        """The longest context (in tokens) of the models served; it bounds a request body."""
        ...


def assistant_message(
    body: ChatCompletionRequest, job: Job, sample: Sample, tokenizer: Any
) -> tuple[dict[str, Any], str, Sample]:
    """The assistant message of `sample`, its finish reason, and the sample as returned.

    With `parallel_tool_calls=False` only the first call is kept, and the returned sample
    ends where that call ends: the token ids (and logprobs) a trajectory trains on are
    the ones of the message it records, never of a call that was dropped.
    """
    text = job.prefill + sample.text
    if not job.parse_tools:
        return {"role": "assistant", "content": text}, sample.finish_reason, sample
    ends: list[int] = []
    if job.forced_tool is not None:
        calls, content = _forced_call(job.forced_tool, sample.text), None
    else:
        parsed = parse_tool_calls(text)
        calls, content, ends = parsed.tool_calls, parsed.content, parsed.call_ends
    if not calls or any(call["function"]["name"] not in job.tool_names for call in calls):
        # malformed: as text
        return {"role": "assistant", "content": text}, sample.finish_reason, sample
    if not body.parallel_tool_calls and len(calls) > 1:
        calls = calls[:1]
        sample = _truncated(sample, tokenizer, ends[0] - len(job.prefill))
    return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls", sample


def _truncated(sample: Sample, tokenizer: Any, end: int) -> Sample:
    """`sample` cut after the fewest tokens whose text reaches character `end`."""
    lengths = prefix_lengths(tokenizer, sample.token_ids)
    count = next((k for k, length in enumerate(lengths, start=1) if length >= end), None)
    if count is None:
        return sample
    return Sample(
        token_ids=sample.token_ids[:count],
        logprobs=sample.logprobs[:count],
        top_logprobs=sample.top_logprobs[:count],
        finish_reason=sample.finish_reason,
        text=tokenizer.decode(sample.token_ids[:count], skip_special_tokens=True),
    )


def _forced_call(name: str, arguments_text: str) -> list[dict[str, Any]]:
    """The call whose arguments the model wrote after a forced `"arguments": ` prefill.

    The first complete JSON object is the arguments; whatever follows is ignored.
    """
    try:
        arguments, _ = json.JSONDecoder().raw_decode(arguments_text.lstrip())
    except json.JSONDecodeError:
        return []
    if not isinstance(arguments, dict):
        return []
    return [tool_call(name, arguments)]


def _logprobs(route: Route, sample: Sample, as_ids: bool) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        token = f"token_id:{token_id}" if as_ids else route.tokenizer.decode([token_id])
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    content = []
    for i, (token_id, logprob) in enumerate(zip(sample.token_ids, sample.logprobs, strict=True)):
        item = entry(token_id, logprob)
        alternatives = sample.top_logprobs[i] if sample.top_logprobs else []
        item["top_logprobs"] = [entry(t, lp) for t, lp in alternatives]
        content.append(item)
    return {"content": content, "refusal": None}


def choice(
    body: ChatCompletionRequest, route: Route, job: Job, index: int, sample: Sample
) -> dict[str, Any]:
    message, finish_reason, sample = assistant_message(body, job, sample, route.tokenizer)
    return {
        "index": index,
        "message": message,
        "finish_reason": finish_reason,
        "logprobs": (
            _logprobs(route, sample, bool(body.return_tokens_as_token_ids))
            if body.logprobs
            else None
        ),
        "prompt_token_ids": job.prompt_ids,
        "token_ids": sample.token_ids,
        "token_logprobs": sample.logprobs,
        # The checkpoint step that sampled this choice (ART's `policy_version`), so an
        # asynchronous trainer can tell how stale the rollout is; None for the base model.
        "policy_version": route.step,
    }


def usage(job: Job, samples: list[Sample]) -> dict[str, int]:
    completion = sum(len(sample.token_ids) for sample in samples)
    prompt = len(job.prompt_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion(
    body: ChatCompletionRequest, route: Route, job: Job, samples: list[Sample]
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.model,
        "choices": [choice(body, route, job, i, sample) for i, sample in enumerate(samples)],
        "usage": usage(job, samples),
    }


__all__ = ["Job", "Route", "assistant_message", "choice", "completion", "no_release", "usage"]
