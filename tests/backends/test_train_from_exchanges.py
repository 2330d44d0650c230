"""A step trained from captured exchanges moves the shared default model towards the
rewarded answer.

The exchanges are built by hand from real Chat Completions requests and the responses the
endpoint sent (with its token ids), as a capture scope records them.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import torch

import art
from art.core.data.exchanges import ChatCompletionsExchange, TrajectoryExchanges
from art.core.store.model_store import ModelStore
from art.local import LocalBackend

pytestmark = pytest.mark.model  # trains the shared default model

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPT = [{"role": "user", "content": "Tell me a short story about a cat."}]


def completion_logprob(default_model: tuple[Any, Any], checkpoint: Path, tokens: Any) -> float:
    """The sampled completion's total logprob given its prompt, under `checkpoint`'s adapter."""
    from peft import PeftModel

    base, _ = default_model
    scorer = PeftModel.from_pretrained(copy.deepcopy(base), str(checkpoint))
    prompt, sampled = tokens["prompt_token_ids"], tokens["token_ids"]
    with torch.no_grad():
        logits = scorer(input_ids=torch.tensor([prompt + sampled])).logits[0, len(prompt) - 1 : -1]
        picked = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(sampled)[:, None])
    return float(picked.sum())


async def test_a_step_from_captured_exchanges_raises_the_rewarded_answers_logprob(
    shared_backend: LocalBackend, unique_project: str, default_model: tuple[Any, Any]
) -> None:
    model = art.TrainableModel(name="exchanges", project=unique_project, base_model=BASE)
    await model.register(shared_backend)
    client = model.openai_client()
    exchanges = []
    for _ in range(3):
        request = {
            "model": model.get_inference_name(),
            "messages": PROMPT,
            "max_tokens": 12,
            "temperature": 1.0,
        }
        started = datetime.now(UTC)
        completion = await client.chat.completions.create(**request)
        exchanges.append(
            ChatCompletionsExchange(
                start_time=started, end_time=datetime.now(UTC), request=request, response=completion
            )
        )
    sampled = [e.response.choices[0].model_extra or {} for e in exchanges]
    # The first answer, and any the same, are rewarded: the step has a signal whatever was sampled.
    rewards = [float(s["token_ids"] == sampled[0]["token_ids"]) for s in sampled]
    if min(rewards) == 1.0:
        rewards[-1] = 0.0  # all three the same: a group that still has a signal
    group = art.TrajectoryGroup(
        art.Trajectory(exchanges=TrajectoryExchanges(chat_completions=[exchange]), reward=reward)
        for exchange, reward in zip(exchanges, rewards, strict=True)
    )
    assert group.trajectories[0].messages()[0] == PROMPT[0]

    await model.train([group], config=art.TrainConfig(learning_rate=1e-3))
    assert await model.get_step() == 1

    store = ModelStore(Path(shared_backend.path), unique_project, "exchanges")
    assert (
        store.read_trajectories("train", 0)[0].trajectories[0].exchanges
        == group.trajectories[0].exchanges
    )  # logged whole
    checkpoints = (
        Path(shared_backend.path) / unique_project / "models" / "exchanges" / "checkpoints"
    )
    before = completion_logprob(default_model, checkpoints / "0000", sampled[0])
    after = completion_logprob(default_model, checkpoints / "0001", sampled[0])
    assert after > before, (before, after)
