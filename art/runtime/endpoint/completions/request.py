"""What a `/v1/completions` request may hold, and its prompts made ready for the engine.

A prompt is a text, a list of texts, a list of token ids or a list of lists of ids. Text
is tokenized with the tokenizer's own special tokens (as vLLM does; vLLM's
`add_special_tokens: false` turns them off); token ids are checked against the vocabulary
and taken as given. Each prompt becomes one engine `Job`, fitted to the context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from ....core.data.errors import ArtValueError
from ...engines.base import SamplingParams
from ..jobs import token_budget
from ..request import MAX_SEED, ApiError, check_stop, parse_body
from ..response import Job, Route

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
        return check_stop(stop)

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
    body = parse_body(raw, CompletionRequest)
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
    asked = body.max_tokens if "max_tokens" in body.model_fields_set else None
    max_tokens = token_budget(route, ids, param, asked, DEFAULT_COMPLETION_TOKENS)
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        stop=stop,
        seed=body.seed,
        top_logprobs=body.logprobs or 0,
    )


__all__ = [
    "DEFAULT_COMPLETION_TOKENS",
    "MAX_LOGPROBS",
    "MAX_ROWS",
    "CompletionRequest",
    "Prompt",
    "StreamOptions",
    "parse_completion_request",
    "prepare_prompts",
]
