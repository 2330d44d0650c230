"""`POST /v1/completions`: OpenAI's legacy Completions API, as OpenAI documents it and vLLM
serves it.

The prompt is sampled as written, with no chat template; a batch of prompts is one engine
request per prompt. `request.py` holds what a request may hold and its prompts made ready,
`answer.py` the whole answer, `stream.py` the streamed one; the route is here.

Honoured: `max_tokens` (16 unless set), `temperature`, `top_p`, `n`, `best_of` (the `n`
samples of highest mean token logprob among `best_of`), `stop`, `seed`, `logprobs` (0-5),
`echo` (the prompt text before the completion), `stream` (with
`stream_options.include_usage`), `user`. Refused with a 400 naming the field: `suffix`,
`logit_bias`, penalties other than 0, `echo` with `logprobs` (the engine computes no
prompt logprobs), `best_of` above `n` when streaming.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ...engines.base import Sample
from ..jobs import find_route, once, read_request, run_job
from ..response import Route
from ..streaming import event_stream
from .answer import completion
from .request import CompletionRequest, Prompt, parse_completion_request, prepare_prompts
from .stream import stream

if TYPE_CHECKING:
    from ..response import Router


def add_completions_route(
    app: FastAPI, router: Router, max_body_bytes: Callable[[], int], *, tokens_as_ids: bool = False
) -> None:
    """Serve `POST /v1/completions` on `app` for `router`'s models.

    `tokens_as_ids`: logprob tokens are written `token_id:N` unless a request says
    otherwise, as for chat completions (`build_app`).
    """

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> JSONResponse | StreamingResponse:
        body = await read_request(request, max_body_bytes(), parse_completion_request)
        if body.return_tokens_as_token_ids is None:
            body.return_tokens_as_token_ids = tokens_as_ids
        route = await find_route(router, body.model)
        release = once(route.release)
        streaming = False
        try:
            prompts = await asyncio.to_thread(prepare_prompts, body, route)
            if body.stream:
                streaming = True
                return event_stream(stream(body, route, prompts, release), release)
            samples = await _sample(request, route, prompts, body.rows)
            # Text offsets decode every prefix of every sample: off the event loop.
            answer = await asyncio.to_thread(completion, body, route, prompts, samples)
            return JSONResponse(answer)
        finally:
            if not streaming:
                release()


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


__all__ = [
    "CompletionRequest",
    "add_completions_route",
    "parse_completion_request",
    "prepare_prompts",
]
