"""A whole `/v1/completions` answer: `text_completion` choices with their token ids.

Choice `p * n + j` is sample `j` of prompt `p`, as OpenAI orders them. Each choice carries
the token-id fields training reads (`prompt_token_ids`, `token_ids`, `token_logprobs`,
`policy_version`; see `..response`), and `logprobs` in the legacy shape (`tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ...engines.base import Sample
from ...engines.token_text import prefix_lengths
from ..response import Route
from .request import CompletionRequest, Prompt


def completion(
    body: CompletionRequest, route: Route, prompts: list[Prompt], samples: list[list[Sample]]
) -> dict[str, Any]:
    """The answer to `body`: the `n` best of each prompt's samples, and the usage."""
    choices = [
        choice(body, route, p * body.n + j, prompt, sample)
        for p, (prompt, row) in enumerate(zip(prompts, samples, strict=True))
        for j, sample in enumerate(_best(row, body.n))
    ]
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": body.model,
        "choices": choices,
        "usage": usage(prompts, samples),
    }


def _best(samples: list[Sample], n: int) -> list[Sample]:
    """The `n` samples of highest mean token logprob (OpenAI's `best_of`), in draw order
    among equals."""
    if len(samples) == n:
        return samples

    def mean_logprob(sample: Sample) -> float:
        return sum(sample.logprobs) / max(len(sample.logprobs), 1)

    return sorted(samples, key=mean_logprob, reverse=True)[:n]


def usage(prompts: list[Prompt], samples: list[list[Sample]]) -> dict[str, int]:
    """Every prompt once, every sequence sampled (those `best_of` dropped included)."""
    prompt = sum(len(p.job.prompt_ids) for p in prompts)
    completion = sum(len(sample.token_ids) for row in samples for sample in row)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def choice(
    body: CompletionRequest, route: Route, index: int, prompt: Prompt, sample: Sample
) -> dict[str, Any]:
    """Choice `index`: `sample` of `prompt`, its token ids, and its logprobs if asked for."""
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
    """Where each token's text starts in `sample.text`: the length of the text its earlier
    tokens decode to (the text's length for tokens past a stop string, or with no text of
    their own)."""
    before = [0, *prefix_lengths(tokenizer, sample.token_ids)][: len(sample.token_ids)]
    return [min(length, len(sample.text)) for length in before]


__all__ = ["choice", "completion", "usage"]
