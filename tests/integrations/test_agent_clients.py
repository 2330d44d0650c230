"""Train the agent you already have: each client library, captured and trained one step.

Each test runs an agent written against one client library (the OpenAI SDK in its three
APIs, Anthropic's SDK, LiteLLM, LangGraph on LangChain's OpenAI and Anthropic chat
models, the OpenAI Agents SDK, `requests`, aiohttp), taken from the guide's snippets
(`docs/snippets/agents_*.py`), with nothing of `art` in the agent's logic: its client is
pointed at the endpoint and carries art's capturing hook (nothing of any library is
patched, so the hook is given where the client is made). Two rollouts, each
inside `with art.Trajectory() as t:`, are captured into `t.exchanges`; the first is
rewarded, the group trains one GRPO step from the base model, and the rewarded rollout's
logprob, less the other's, must be higher under the new checkpoint than under the base
that sampled them. The two rollouts ask different questions, so their completions differ and the
step has something to tell apart.
"""

from __future__ import annotations

import copy
import json
import runpy
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import art
from art.core.data.exchanges import sampled_tokens
from art.local import LocalBackend

pytestmark = pytest.mark.model

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
QUESTIONS = ("Name a fruit.", "Name a color.")

Agent = Callable[[art.TrainableModel, str], Awaitable[None]]


@pytest.fixture(scope="module")
def scorer(default_model: tuple[Any, Any]) -> Any:
    """A copy of the base model to score completions under (the shared one stays bare)."""
    base, _ = default_model
    return copy.deepcopy(base)


def completion_logprob(
    scorer: Any, adapter: Path | None, prompt: list[int], tokens: list[int]
) -> float:
    """The completion's total logprob given its prompt, under `adapter` (None: the base)."""
    model = scorer
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(scorer, str(adapter))
    try:
        with torch.no_grad():
            ids = torch.tensor([prompt + tokens])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
            picked = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(tokens)[:, None])
        return float(picked.sum())
    finally:
        if adapter is not None:
            model.unload()  # the scorer is the bare base again


async def captured(model: art.TrainableModel, agent: Agent, question: str) -> art.Trajectory:
    with art.Trajectory() as trajectory:
        await agent(model, question)
    return trajectory


async def trains_one_step(
    shared_backend: LocalBackend, project: str, name: str, agent: Agent, scorer: Any
) -> art.Trajectory:
    """Capture two rollouts of `agent`, train one step rewarding the first, check it learned."""
    model = art.TrainableModel(name=name, project=project, base_model=BASE)
    await model.register(shared_backend)
    rollouts = [await captured(model, agent, question) for question in QUESTIONS]
    for rollout in rollouts:
        assert rollout.exchanges, "the client's calls were not captured"
    samples = [
        [sample for exchange in rollout.exchanges.all() for sample in sampled_tokens(exchange)]
        for rollout in rollouts
    ]
    assert samples[0], f"no exchange of the rewarded rollout carries token ids: {rollouts[0].logs}"
    rollouts[0].reward, rollouts[1].reward = 1.0, 0.0
    await model.train([art.TrajectoryGroup(rollouts)], config=art.TrainConfig(learning_rate=1e-3))
    assert await model.get_step() == 1
    checkpoint = Path(shared_backend.path) / project / "models" / name / "checkpoints" / "0001"

    def total(adapter: Path | None, rollout: int) -> float:
        return sum(
            completion_logprob(scorer, adapter, sample.prompt_token_ids, sample.token_ids)
            for sample in samples[rollout]
        )

    # What one GRPO step raises is the advantage-weighted logprob: the rewarded rollout's
    # against the other's. Each alone may fall with it where the two share most tokens
    # (two tool calls of one tool), so neither alone is asserted.
    before = total(None, 0) - total(None, 1)
    after = total(checkpoint, 0) - total(checkpoint, 1)
    assert after > before, (before, after)
    return rollouts[0]


SNIPPETS = Path(__file__).parents[2] / "docs" / "snippets"


def snippet_agent(snippet: str, name: str) -> Agent:
    """An agent function of a guide's snippet: the code the docs show is the code trained."""
    return runpy.run_path(str(SNIPPETS / snippet), run_name="docs_snippet")[name]  # type: ignore[no-any-return]


AGENTS: dict[str, tuple[str, str]] = {
    "openai-chat": ("agents_openai.py", "chat_agent"),
    "openai-sync-stream": ("agents_openai.py", "sync_streaming_agent"),
    "openai-completions": ("agents_openai.py", "completions_agent"),
    "openai-responses": ("agents_openai.py", "responses_agent"),
    "anthropic-tools": ("agents_anthropic.py", "anthropic_agent"),
    "litellm": ("agents_litellm.py", "litellm_agent"),
    "langgraph-chatopenai": ("agents_langchain.py", "chatopenai_agent"),
    "langgraph-chatanthropic": ("agents_langchain.py", "chatanthropic_agent"),
    "openai-agents": ("agents_openai_agents.py", "openai_agents_agent"),
    "requests": ("agents_http.py", "requests_agent"),
    "aiohttp": ("agents_http.py", "aiohttp_agent"),
}


@pytest.mark.parametrize("client", list(AGENTS))
async def test_a_rollout_is_captured_and_one_step_raises_the_rewarded_logprob(
    shared_backend: LocalBackend, unique_project: str, scorer: Any, client: str
) -> None:
    agent = snippet_agent(*AGENTS[client])
    rewarded = await trains_one_step(shared_backend, unique_project, client, agent, scorer)
    # The trajectory reads as a conversation (RULER and `art show` use it).
    assert rewarded.messages(), rewarded
    json.dumps(rewarded.model_dump(mode="json"))  # and stores as JSON
