"""Shared fixtures. Everything here is real: files on disk, HTTP servers on 127.0.0.1."""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import JsonHandler, serving

# Tests never reach a hub or a tracking service, however pytest is started.
for _name, _value in {
    "HF_HUB_OFFLINE": "1",
    "WANDB_MODE": "offline",
    "WEAVE_DISABLED": "true",
    "LANGFUSE_TRACING_ENABLED": "false",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}.items():
    os.environ.setdefault(_name, _value)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A thread a test left behind must not hold the run open until CI's limit: if the
    process has not exited two minutes after the last test, print every thread's stack
    and exit with status 1."""
    faulthandler.dump_traceback_later(120, exit=True)


class _ChatServer(JsonHandler):
    """A minimal OpenAI-compatible chat endpoint standing in for an external model.

    It answers every request by echoing the last user message, with logprobs, and calls
    a tool when the request offers one, so the real OpenAI client parses real responses.
    """

    def do_POST(self) -> None:
        request = self.read_json()
        last_user = next(m for m in reversed(request["messages"]) if m["role"] == "user")
        text = f"echo: {last_user['content']}"
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if request.get("tools"):
            name = request["tools"][0]["function"]["name"]
            message["tool_calls"] = [
                {"id": "call_1", "type": "function", "function": {"name": name, "arguments": "{}"}}
            ]
        tokens = text.split()
        body = {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 0,
            "model": request["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls" if "tool_calls" in message else "stop",
                    "message": message,
                    "logprobs": {
                        "content": [
                            {
                                "token": t,
                                "logprob": -0.1,
                                "bytes": list(t.encode()),
                                "top_logprobs": [],
                            }
                            for t in tokens
                        ]
                    },
                }
            ],
            "usage": {
                "prompt_tokens": 3,
                "completion_tokens": len(tokens),
                "total_tokens": 3 + len(tokens),
            },
        }
        self.send_json(body)


@pytest.fixture(scope="session")
def chat_server_url() -> Iterator[str]:
    with serving(_ChatServer) as url:
        yield url


class ScriptedChat:
    """A chat endpoint that answers with the texts queued in `answers`, in order.

    It records every request body in `requests`, so a test can count the calls that
    reached it. With nothing queued it answers 400, which clients do not retry.
    """

    def __init__(self) -> None:
        self.answers: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self.url = ""


@pytest.fixture
def scripted_chat() -> Iterator[ScriptedChat]:
    script = ScriptedChat()

    class Handler(JsonHandler):
        def do_POST(self) -> None:
            request = self.read_json()
            script.requests.append(request)
            body: dict[str, Any] = {"error": {"message": "no scripted answer left"}}
            if script.answers:
                body = {
                    "id": f"chatcmpl-scripted-{len(script.requests)}",
                    "object": "chat.completion",
                    "created": 0,
                    "model": request["model"],
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": script.answers.pop(0)},
                        }
                    ],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
                }
            self.send_json(body, 200 if "choices" in body else 400)

    with serving(Handler) as url:
        script.url = url
        yield script


@pytest.fixture
def art_path(tmp_path: Path) -> Path:
    return tmp_path / ".art"


@pytest.fixture(scope="session")
def default_model() -> tuple[Any, Any]:
    """The embedded default model and its tokenizer, loaded once (converted from GGUF on first use).

    Session-wide and shared: a test that wraps the model (LoRA) must wrap a copy. fp32, so
    tests can compare numbers tightly whatever dtype the hardware would pick.
    """
    from art.runtime.models import DEFAULT_MODEL, load, resolve

    return load(resolve(DEFAULT_MODEL), "float32")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster for the session. Its logical CPUs exceed this machine's cores:
    Ray reserves them for placement, and the tests' actors are mostly idle."""
    import ray

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
