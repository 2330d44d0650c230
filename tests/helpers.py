"""Builders of realistic trajectories, and stand-in chat endpoints on 127.0.0.1, for tests."""

from __future__ import annotations

import fcntl
import json
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from openai.types.chat.chat_completion import Choice

import art
from art.core.store.model_store import ModelStore


def sampled_choice(text: str, *, tool_call: dict[str, Any] | None = None) -> Choice:
    """A Choice as a chat endpoint returns it, with per-token logprobs."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_call is not None:
        message["tool_calls"] = [tool_call]
    tokens = text.split() or [""]
    return Choice.model_validate(
        {
            "index": 0,
            "finish_reason": "tool_calls" if tool_call else "stop",
            "message": message,
            "logprobs": {
                "content": [
                    {"token": t, "logprob": -0.25, "bytes": list(t.encode()), "top_logprobs": []}
                    for t in tokens
                ]
            },
        }
    )


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def tool_trajectory(reward: float, *, city: str = "Paris") -> art.Trajectory:
    """system, user, assistant tool call, tool result, final assistant answer."""
    call = {
        "id": "call_7",
        "type": "function",
        "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'},
    }
    return art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "You answer weather questions."},
            {"role": "user", "content": f"Weather in {city}?"},
            sampled_choice("", tool_call=call),
            {"role": "tool", "tool_call_id": "call_7", "content": "sunny, 21C"},
            sampled_choice(f"It is sunny in {city}."),
        ],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        reward=reward,
        metrics={"turns": 2, "correct": reward > 0.5},
        metadata={"city": city, "attempt": 1},
        logs=["called get_weather once"],
    )


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet request handler that reads and answers JSON bodies."""

    def read_json(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))

    def send_json(self, body: dict[str, Any], status: int = 200) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on 127.0.0.1 from a thread; yields its OpenAI-style `/v1` base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def assert_trained_the_groups_told_apart(run_dir: Path) -> None:
    """A recipe ran as written and each of its GRPO steps trained exactly the groups whose
    stored rewards differ (the only ones GRPO learns from), with loss-bearing tokens where
    there was one: what holds on any draw. Whether a draw gave some group different rewards
    is the draw's (a 135M model at temperature 1 can earn the same in every rollout)."""
    store = ModelStore.at(run_dir)
    # The rows of GRPO steps' results, in order (not SFT's, not `model.log(groups)`'s):
    # `model.train` writes its own at the step it trained from, ART 0.5's
    # `model.log(metrics=result.metrics, step=result.step)` one step later, each after the
    # groups' trajectories were logged.
    grpo = ("loss/train", "data/step_num_groups_trainable")
    rows = [row for row in store.read_history() if all(key in row for key in grpo)]
    steps = store.logged_steps("train")
    assert rows, f"no training step in {store.history_path}"
    assert len(rows) == len(steps), (len(rows), steps)
    for row, step in zip(rows, steps, strict=True):
        groups = store.read_trajectories("train", step)
        told_apart = sum(len({t.reward for t in group.trajectories}) > 1 for group in groups)
        assert row["data/step_num_groups_trainable"] == told_apart, (row, step, told_apart)
        assert (row["data/step_loss_bearing_tokens"] > 0) == (told_apart > 0), row


# Seconds this process waited for each lock since conftest.py last took the figures: a
# worker that waits sits idle, so the suite's summary prints them per module.
lock_waits: dict[str, float] = {}


@contextmanager
def one_at_a_time(name: str) -> Iterator[None]:
    """Hold the lock `name` across every process of this machine's test runs.

    `make test` runs two pytest workers; what must not run twice at once (a Ray cluster,
    a vLLM server and the memory it reserves) takes its lock for as long as it runs.
    """
    path = Path(tempfile.gettempdir()) / f"art-tests-{name}.lock"
    with path.open("a") as handle:
        asked = time.monotonic()
        fcntl.flock(handle, fcntl.LOCK_EX)
        lock_waits[name] = lock_waits.get(name, 0.0) + time.monotonic() - asked
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def save_random_llama(
    directory: Path, tokenizer_dir: str, *, hidden_size: int, layers: int
) -> Path:
    """A Llama of `layers` layers, randomly initialised (seed 0), saved in `directory` with
    the tokenizer in `tokenizer_dir`: a base model with no weights to download that
    loads in a second."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def tiny_causal_lm(model_type: str, *, device: str = "cpu", max_positions: int = 256) -> Any:
    """A randomly initialised float32 model of `model_type` (seed 0), small enough to build
    in a test; its biases, if any (Qwen2's q/k/v, 0 at start), drawn so they count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type,
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.5)
    return model.to(device).eval().requires_grad_(False)


def tokenizer_dir() -> str:
    """The default model's tokenizer: `ART_TOKENIZER_DIR` where set (a GPU machine without
    the model, `make gpu-wheels`), else the default model's own directory."""
    import os

    configured = os.environ.get("ART_TOKENIZER_DIR")
    if configured:
        return configured
    from art.runtime.models import default_model_dir

    return str(default_model_dir())


def leaked(status: int, text: str, leaks: Iterable[str]) -> list[str]:
    """What no answer to a fuzzed request may hold: a 5xx, a traceback, a server path."""
    found = [f"status {status}: {text[:300]}"] if status >= 500 else []
    if "Traceback" in text:
        found.append("a traceback in the body")
    return found + [f"the server path {leak!r} in the body" for leak in leaks if leak in text]


def live_rss_bytes() -> int:
    """This process's RSS as a step's plan reads it under a configured budget: after the
    heap's free pages went back to the system (`memory.return_free_heap`)."""
    from art.runtime.trainer.memory import return_free_heap

    return_free_heap()
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) * 1024


# The two kinds of fast tokenizer a decode loop meets, for tests of text grown a token at
# a time: `tokenizer_of_kind(kind, text)`.
TOKENIZER_KINDS = ["byte-level BPE", "metaspace with byte fallback"]


def tokenizer_of_kind(kind: str, text: str) -> Any:
    """The default model's tokenizer (byte-level BPE, GPT-2's kind), or a SentencePiece-style
    one trained on `text` (`metaspace_tokenizer`)."""
    if kind == "byte-level BPE":
        from transformers import AutoTokenizer

        from art.runtime import models

        return AutoTokenizer.from_pretrained(models.default_model_dir())
    return metaspace_tokenizer(text)


def metaspace_tokenizer(text: str) -> Any:
    """A SentencePiece-style BPE (Llama 2, Mistral): spaces as "▁", bytes as tokens where no
    piece covers them, the first space stripped when decoding. Trained on `text`, in milliseconds."""
    from tokenizers import Tokenizer, decoders, normalizers, trainers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(BPE(byte_fallback=True, unk_token="<unk>"))
    backend.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    special = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256))]
    backend.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, special_tokens=special))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
