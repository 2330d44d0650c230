"""`POST /v1/completions`: OpenAI's legacy Completions API, as OpenAI documents it and vLLM
serves it.

The prompt is sampled as written, with no chat template: text is tokenized with the
tokenizer's own special tokens (as vLLM does; vLLM's `add_special_tokens: false` turns
them off), token ids are taken as given. A batch of prompts is one engine request per
prompt; choice `p * n + j` is sample `j` of prompt `p`, as OpenAI orders them. Each choice
carries the token-id fields training reads (`prompt_token_ids`, `token_ids`,
`token_logprobs`, `policy_version`; see `response.py`), and `logprobs` in the legacy shape
(`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).

Honoured: `max_tokens` (16 unless set), `temperature`, `top_p`, `n`, `best_of` (the `n`
samples of highest mean token logprob among `best_of`), `stop`, `seed`, `logprobs` (0-5),
`echo` (the prompt text before the completion), `stream` (with
`stream_options.include_usage`), `user`. Refused with a 400 naming the field: `suffix`,
`logit_bias`, penalties other than 0, `echo` with `logprobs` (the engine computes no
prompt logprobs), `best_of` above `n` when streaming.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)
from starlette.background import BackgroundTask

from ...core.errors import ArtValueError
from ..engines.base import Sample, SamplingParams
from .jobs import run_job
from .request import MAX_SEED, ApiError, read_body, validation_error
from .response import Job, Route

if TYPE_CHECKING:
    from .server import Router

logger = logging.getLogger("art.endpoint")

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default `max_tokens` for this API
MAX_LOGPROBS = 5  # OpenAI's limit on `logprobs`
MAX_ROWS = 1024  # sequences one request may sample: prompts x max(n, best_of)
_PROMPT_SHAPES = "a string, a list of strings, a list of token ids, or a list of lists of ids"


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False  # a last chunk, with no choices, holds the usage


class CompletionRequest(BaseModel):
    """A `/v1/completions` body. A null field means its default, as OpenAI reads it."""

    model_config = ConfigDict(extra="forbid")

    model: str
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: int = Field(default=DEFAULT_COMPLETION_TOKENS, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    n: int = Field(default=1, ge=1, le=64)
    best_of: int | None = Field(default=None, ge=1, le=64)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None  # refused unless empty: see `_refuse_unsupported`
    logit_bias: dict[str, float] | None = None  # refused unless empty
    frequency_penalty: float = 0.0  # refused unless 0
    presence_penalty: float = 0.0  # refused unless 0
    user: str | None = None  # an end-user id for the caller's own bookkeeping
    # vLLM's extensions: the tokenizer's special tokens around a text prompt, and logprob
    # tokens written `token_id:N` so the sampled ids survive a client that rebuilds them.
    add_special_tokens: bool = True
    return_tokens_as_token_ids: bool | None = None  # None: the server's default

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data

    @field_validator("prompt", mode="before")
    @classmethod
    def _check_prompt(cls, prompt: Any) -> Any:
        fix = f"Send {_PROMPT_SHAPES}"
        if isinstance(prompt, str):
            return prompt
        if not isinstance(prompt, list) or not prompt:
            raise ArtValueError("prompt", f"must be {_PROMPT_SHAPES}, not {prompt!r:.40}", fix)
        first = prompt[0]
        for index, item in enumerate(prompt):
            if isinstance(first, str) and isinstance(item, str):
                continue
            if _is_token_id(first) and _is_token_id(item):
                continue
            if isinstance(first, list) and isinstance(item, list):
                if not item or not all(_is_token_id(token) for token in item):
                    raise ArtValueError(
                        f"prompt[{index}]", "must be a non-empty list of token ids (integers)", fix
                    )
                continue
            raise ArtValueError(f"prompt[{index}]", f"{item!r:.40} does not match prompt[0]", fix)
        return prompt

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and (len(stop) > 4 or not all(stop)):
            raise ValueError("stop takes at most 4 non-empty strings")
        if stop == "":
            raise ValueError("stop must not be empty")
        return stop

    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the batch: a text, or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(item, int) for item in prompt):
            return [[int(item) for item in prompt]]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]

    @property
    def rows(self) -> int:
        """Samples drawn per prompt: `best_of`, else `n`."""
        return self.best_of or self.n


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_completion_request(raw: bytes) -> CompletionRequest:
    """The validated request in `raw` (a JSON body), or a 400 naming the bad value."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(
            400, f"body: the request body is not valid JSON ({error})", param="body"
        ) from error
    if not isinstance(data, dict):
        raise ApiError(400, "body: the request body must be a JSON object", param="body")
    try:
        body = CompletionRequest.model_validate(data)
    except ValidationError as error:
        raise validation_error(error.errors()) from error
    _refuse_unsupported(body)
    return body


def _refuse_unsupported(body: CompletionRequest) -> None:
    if body.suffix:
        raise ApiError(
            400,
            "suffix: text after the completion (insertion) is not supported; leave suffix unset",
            param="suffix",
        )
    if body.logit_bias:
        raise ApiError(
            400,
            "logit_bias is not supported by this engine; leave it unset",
            param="logit_bias",
        )
    for penalty in ("frequency_penalty", "presence_penalty"):
        if getattr(body, penalty) != 0:
            raise ApiError(
                400, f"{penalty} is not supported by this engine; leave it at 0", param=penalty
            )
    if body.best_of is not None and body.best_of < body.n:
        raise ApiError(
            400,
            f"best_of: {body.best_of} is less than n ({body.n}); set best_of >= n",
            param="best_of",
        )
    if body.stream and body.rows > body.n:
        raise ApiError(
            400,
            "best_of: above n it cannot be streamed (the best are known only at the end); "
            "set best_of to n or stream to false",
            param="best_of",
        )
    if body.echo and body.logprobs is not None:
        raise ApiError(
            400,
            "echo: with logprobs it needs the prompt's logprobs, which this engine does not "
            "compute; drop echo or logprobs",
            param="echo",
        )
    if body.stream_options is not None and not body.stream:
        raise ApiError(
            400, "stream_options: only with stream: true; leave it unset", param="stream_options"
        )
    count = len(body.prompts())
    if count * body.rows > MAX_ROWS:
        raise ApiError(
            400,
            f"prompt: {count} prompts x {body.rows} samples each is more than the {MAX_ROWS} "
            "sequences one request may sample; split the batch",
            param="prompt",
        )


@dataclass(frozen=True)
class Prompt:
    """One prompt of a request, made ready for the engine."""

    text: str  # as echoed: the text given, or the given ids decoded
    job: Job


def prepare_prompts(body: CompletionRequest, route: Route) -> list[Prompt]:
    """Each prompt tokenized (or its ids checked) and fitted to the context."""
    prompts = body.prompts()
    batch = not isinstance(body.prompt, str) and not _is_token_id(body.prompt[0])
    vocabulary = len(route.tokenizer)
    ready = []
    for index, prompt in enumerate(prompts):
        param = f"prompt[{index}]" if batch else "prompt"
        if isinstance(prompt, str):
            ids: list[int] = route.tokenizer(
                prompt, add_special_tokens=body.add_special_tokens
            ).input_ids
            text = prompt
        else:
            bad = [token for token in prompt if not 0 <= token < vocabulary]
            if bad:
                raise ApiError(
                    400,
                    f"{param}: token id {bad[0]} is not in this model's vocabulary "
                    f"(0 to {vocabulary - 1})",
                    param=param,
                )
            ids, text = prompt, route.tokenizer.decode(prompt)
        if not ids:
            raise ApiError(400, f"{param}: the prompt has no tokens; send some text", param=param)
        ready.append(Prompt(text, Job(ids, _params(body, route, ids, param), "", None, ())))
    return ready


def _params(body: CompletionRequest, route: Route, ids: list[int], param: str) -> SamplingParams:
    room = route.context_length - len(ids)
    if room < 1:
        raise ApiError(
            400,
            f"{param}: the prompt has {len(ids)} tokens; the model's context is "
            f"{route.context_length}",
            param=param,
            code="context_length_exceeded",
        )
    if "max_tokens" in body.model_fields_set:
        if body.max_tokens > room:
            raise ApiError(
                400,
                f"max_tokens: {body.max_tokens} does not fit: the prompt has {len(ids)} tokens "
                f"and the context is {route.context_length}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        max_tokens = body.max_tokens
    else:
        max_tokens = min(DEFAULT_COMPLETION_TOKENS, room)
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        stop=stop,
        seed=body.seed,
        top_logprobs=body.logprobs or 0,
    )


def add_completions_route(
    app: FastAPI, router: Router, max_body_bytes: Callable[[], int], *, tokens_as_ids: bool = False
) -> None:
    """Serve `POST /v1/completions` on `app` for `router`'s models.

    `tokens_as_ids`: logprob tokens are written `token_id:N` unless a request says
    otherwise, as for chat completions (`build_app`).
    """

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> JSONResponse | StreamingResponse:
        raw = await read_body(request, max_body_bytes())
        body = await asyncio.to_thread(parse_completion_request, raw)
        del raw  # a large body is not kept alive while the request decodes
        if body.return_tokens_as_token_ids is None:
            body.return_tokens_as_token_ids = tokens_as_ids
        try:
            route = await asyncio.to_thread(router.route, body.model)
        except KeyError as error:
            raise ApiError(
                404, str(error.args[0]), param="model", code="model_not_found"
            ) from error
        release = _once(route.release)
        streaming = False
        try:
            prompts = await asyncio.to_thread(prepare_prompts, body, route)
            if body.stream:
                # The stream releases the route when it ends, however it ends; the
                # background task does if the stream never started.
                streaming = True
                return StreamingResponse(
                    _stream(body, route, prompts, release),
                    media_type="text/event-stream",
                    background=BackgroundTask(release),
                )
            samples = await _sample(request, route, prompts, body.rows)
            # Text offsets decode every prefix of every sample: off the event loop.
            answer = await asyncio.to_thread(_completion, body, route, prompts, samples)
            return JSONResponse(answer)
        finally:
            if not streaming:
                release()


def _once(release: Callable[[], None]) -> Callable[[], None]:
    """`release`, run on the first call only (a stream may end two ways, and Starlette
    runs a sync background task on a worker thread)."""
    lock = threading.Lock()
    done = False

    def once() -> None:
        nonlocal done
        with lock:
            if done:
                return
            done = True
        release()

    return once


async def _sample(
    request: Request, route: Route, prompts: list[Prompt], rows: int
) -> list[list[Sample]]:
    """`rows` samples of each prompt, all cancelled if one fails or the client goes."""
    tasks = [asyncio.ensure_future(run_job(request, route, p.job, n=rows)) for p in prompts]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


def _best(samples: list[Sample], n: int) -> list[Sample]:
    """The `n` samples of highest mean token logprob (OpenAI's `best_of`), in draw order
    among equals."""
    if len(samples) == n:
        return samples

    def mean_logprob(sample: Sample) -> float:
        return sum(sample.logprobs) / max(len(sample.logprobs), 1)

    return sorted(samples, key=mean_logprob, reverse=True)[:n]


def _usage(prompts: list[Prompt], samples: list[list[Sample]]) -> dict[str, int]:
    """Every prompt once, every sequence sampled (those `best_of` dropped included)."""
    prompt = sum(len(p.job.prompt_ids) for p in prompts)
    completion = sum(len(sample.token_ids) for row in samples for sample in row)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _choice(
    body: CompletionRequest, route: Route, index: int, prompt: Prompt, sample: Sample
) -> dict[str, Any]:
    return {
        "text": (prompt.text if body.echo else "") + sample.text,
        "index": index,
        "logprobs": _logprobs(body, route, sample) if body.logprobs is not None else None,
        "finish_reason": sample.finish_reason,
        "prompt_token_ids": prompt.job.prompt_ids,
        "token_ids": sample.token_ids,
        "token_logprobs": sample.logprobs,
        "policy_version": route.step,
    }


def _logprobs(body: CompletionRequest, route: Route, sample: Sample) -> dict[str, Any]:
    """OpenAI's legacy logprobs: each token, its logprob, the `logprobs` most likely tokens
    there with the sampled one always among them, and where it starts in the text."""

    def name(token_id: int) -> str:
        if body.return_tokens_as_token_ids:
            return f"token_id:{token_id}"
        return str(route.tokenizer.decode([token_id]))

    top: list[dict[str, float]] = []
    for position, (token_id, logprob) in enumerate(
        zip(sample.token_ids, sample.logprobs, strict=True)
    ):
        alternatives = sample.top_logprobs[position] if sample.top_logprobs else []
        likely = {name(t): lp for t, lp in alternatives[: body.logprobs or 0]}
        likely.setdefault(name(token_id), logprob)
        top.append(likely)
    return {
        "tokens": [name(token_id) for token_id in sample.token_ids],
        "token_logprobs": sample.logprobs,
        "top_logprobs": top,
        "text_offset": _text_offsets(route.tokenizer, sample),
    }


def _text_offsets(tokenizer: Any, sample: Sample) -> list[int]:
    """Where each token's text starts in `sample.text` (its length for tokens past a stop
    string, or with no text of their own)."""
    offsets = []
    for count in range(len(sample.token_ids)):
        before = tokenizer.decode(sample.token_ids[:count], skip_special_tokens=True)
        offsets.append(min(len(before), len(sample.text)))
    return offsets


def _completion(
    body: CompletionRequest, route: Route, prompts: list[Prompt], samples: list[list[Sample]]
) -> dict[str, Any]:
    choices = [
        _choice(body, route, p * body.n + j, prompt, sample)
        for p, (prompt, row) in enumerate(zip(prompts, samples, strict=True))
        for j, sample in enumerate(_best(row, body.n))
    ]
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": body.model,
        "choices": choices,
        "usage": _usage(prompts, samples),
    }


async def _stream(
    body: CompletionRequest, route: Route, prompts: list[Prompt], release: Callable[[], None]
) -> AsyncIterator[str]:
    """Server-sent `text_completion` chunks: text as tokens are sampled, then each choice's
    last chunk with its finish reason and token ids, then `[DONE]`.

    With stop strings or logprobs the text is sent whole in the last chunk, once it is
    known where a stop string cuts it and which logprobs go with it.
    """
    loop = asyncio.get_running_loop()
    tokens: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    incremental = not body.stop and body.logprobs is None
    completion_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    usage = body.stream_options is not None and body.stream_options.include_usage
    n, total = body.n, len(prompts) * body.n

    def chunk(choices: list[dict[str, Any]], counts: dict[str, int] | None = None) -> str:
        data: dict[str, Any] = {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": body.model,
            "choices": choices,
        }
        if usage:
            data["usage"] = counts  # null but in the last chunk, as OpenAI sends it
        return f"data: {json.dumps(data)}\n\n"

    def on_token_of(prompt: int) -> Callable[[int, int], None]:
        def on_token(row: int, token_id: int) -> None:
            loop.call_soon_threadsafe(tokens.put_nowait, (prompt * n + row, token_id))

        return on_token

    tasks = [
        asyncio.ensure_future(
            route.engine.generate(
                prompt.job.prompt_ids,
                prompt.job.params,
                n=n,
                adapter=route.adapter,
                on_token=on_token_of(p) if incremental else None,
            )
        )
        for p, prompt in enumerate(prompts)
    ]
    generation = asyncio.gather(*tasks)
    getter: asyncio.Future[tuple[int, int]] | None = None
    try:
        if body.echo:
            for index in range(total):
                text = prompts[index // n].text
                yield chunk(
                    [{"text": text, "index": index, "logprobs": None, "finish_reason": None}]
                )
        sent = [""] * total
        ids: list[list[int]] = [[] for _ in range(total)]
        while incremental and not (generation.done() and tokens.empty()):
            getter = asyncio.ensure_future(tokens.get())
            waiting: set[asyncio.Future[Any]] = {getter, generation}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                continue
            index, token_id = getter.result()
            ids[index].append(token_id)
            text = route.tokenizer.decode(ids[index], skip_special_tokens=True)
            if text.endswith("\ufffd"):
                continue  # half of a multi-byte character: wait for the rest
            delta, sent[index] = text[len(sent[index]) :], text
            if delta:
                yield chunk(
                    [{"text": delta, "index": index, "logprobs": None, "finish_reason": None}]
                )
        try:
            samples = await generation
        except Exception as error:  # headers are sent: the failure goes in the stream
            logger.warning("stream %s failed: %s: %s", completion_id, type(error).__name__, error)
            failure = {"message": f"generation failed: {error}", "type": "server_error"}
            yield f"data: {json.dumps({'error': failure})}\n\n"
            return
        finals = await asyncio.to_thread(_finals, body, route, prompts, samples, sent)
        for final in finals:
            yield chunk([final])
        if usage:
            yield chunk([], _usage(prompts, samples))
        yield "data: [DONE]\n\n"
    finally:  # the client may have gone: stop decoding for it
        for task in tasks:
            task.cancel()
        if getter is not None:
            getter.cancel()
        release()


def _finals(
    body: CompletionRequest,
    route: Route,
    prompts: list[Prompt],
    samples: list[list[Sample]],
    sent: list[str],
) -> list[dict[str, Any]]:
    """The last chunk of each streamed choice: the text not sent yet, and the ids."""
    finals = []
    for p, row in enumerate(samples):
        for j, sample in enumerate(row):
            index = p * body.n + j
            final = _choice(body, route, index, prompts[p], sample)
            final["text"] = sample.text[len(sent[index]) :]
            finals.append(final)
    return finals


__all__ = [
    "CompletionRequest",
    "add_completions_route",
    "parse_completion_request",
    "prepare_prompts",
]
