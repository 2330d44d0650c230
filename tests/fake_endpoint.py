"""Our endpoint over `FakeEngine`, for tests that must know the exact ids a request gets.

A word-level tokenizer (one id per whitespace-separated word of a fixed list) makes every
prompt's and answer's ids readable in the test that checks them; `FixedRoutes` is the
`Router` the endpoint asks; `serving_app` runs an ASGI app with uvicorn on 127.0.0.1.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import uvicorn

from art.runtime.chat_format import render_prompt, rendering_for
from art.runtime.endpoint.response import Route, no_release
from art.runtime.engines.base import Sample
from art.runtime.engines.fake import FakeEngine, FakeRequest


class Words:
    """A fixed vocabulary: a Hugging Face tokenizer of it, and the ids of its words."""

    def __init__(self, words: list[str]) -> None:
        self.words = words

    def ids(self, *words: str) -> list[int]:
        return [self.words.index(word) for word in words]

    def tokenizer(self, chat_template: str | None = None) -> Any:
        """Splits on whitespace, adds no special tokens; `<unk>` and `<eos>` must be words."""
        from tokenizers import Tokenizer, pre_tokenizers
        from tokenizers.models import WordLevel
        from transformers import PreTrainedTokenizerFast

        vocab = {word: i for i, word in enumerate(self.words)}
        backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>"
        )
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        return tokenizer


def fake_route(
    engine: FakeEngine,
    context: int,
    adapter: str | None = None,
    step: int | None = None,
    release: Callable[[], None] = no_release,
) -> Route:
    """A route to `engine` rendering with its tokenizer's chat template."""
    rendering = rendering_for(engine.tokenizer)
    return Route(engine, engine.tokenizer, rendering, adapter, context, step, release)


class FixedRoutes:
    """A `Router` over fixed routes by name, refusing others as the model service does."""

    def __init__(self, routes: Mapping[str, Route], context: int) -> None:
        self.routes = dict(routes)
        self.context = context

    def route(self, model: str) -> Route:
        if model not in self.routes:
            served = ", ".join(self.model_names())
            raise KeyError(f"unknown model {model!r}; this endpoint serves {served}")
        return self.routes[model]

    def model_names(self) -> list[str]:
        return sorted(self.routes)

    def longest_context(self) -> int:
        return self.context


class Script:
    """The samples the engine answers with, one per request, in order; `default` when out."""

    def __init__(self, default: Sample) -> None:
        self.samples: list[Sample] = []
        self.default = default

    def __call__(self, request: FakeRequest) -> list[Sample]:
        return [self.samples.pop(0) if self.samples else self.default]


class ScriptedRoute(FixedRoutes):
    """One route, "base", to a FakeEngine answering from `script`, counting its releases."""

    def __init__(self, tokenizer: Any, default: Sample, context: int) -> None:
        self.tokenizer = tokenizer
        self.script = Script(default)
        eos = frozenset({tokenizer.eos_token_id})  # grammars need a token that ends them
        self.engine = FakeEngine(tokenizer, self.script, stop_token_ids=eos)
        self.releases = 0
        self.served_route = fake_route(self.engine, context, release=self._release)
        super().__init__({"base": self.served_route}, context)

    def _release(self) -> None:
        self.releases += 1

    def prompt(self, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
        """The prompt ids the chat template gives these chat `messages`."""
        text = render_prompt(self.tokenizer, messages, tools, self.served_route.rendering)
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)


@contextmanager
def serving_app(app: Any) -> Iterator[str]:
    """`app` served by uvicorn in a thread on a free port of 127.0.0.1; its root URL."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    started = threading.Event()
    for _ in range(3000):  # 30 s
        if server.started:
            break
        if not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        started.wait(0.01)
    else:
        raise RuntimeError("uvicorn did not start in 30 s")
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
