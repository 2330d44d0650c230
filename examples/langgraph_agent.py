"""Train the model behind an ordinary LangGraph agent, on this machine's CPU.

The agent is a prebuilt LangGraph ReAct agent with one tool that looks capitals up in
a small local data set (`data/capitals.json`). The only changes to make it trainable:
the chat model comes from `art.langgraph.init_chat_model()`, and the rollout is wrapped
with `art.langgraph.wrap_rollout`, which records every LLM call the graph makes (with
the sampled token ids) into the Trajectory the rollout returns. The reward is code:
0.5 for calling the tool with the asked country, 0.5 more for naming the capital.

    python examples/langgraph_agent.py [--steps 2] [--group-size 4] [--path .art] [--fresh]

A second start resumes the run from its last checkpoint; `--fresh` deletes it first.
"""

from __future__ import annotations

# --8<-- [start:imports]
import argparse
import asyncio
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent

import art
from art.langgraph import init_chat_model, wrap_rollout
from art.local import LocalBackend

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DATA = json.loads((Path(__file__).parent / "data" / "capitals.json").read_text())
CAPITALS = {row["country"]: row["capital"] for row in DATA}
SYSTEM = (
    "You answer questions about countries. "
    'To find a capital, call lookup_capital with {"country": "<name>"}.'
)
# --8<-- [end:imports]
# create_react_agent is deprecated in favour of langchain's create_agent; it still runs.
warnings.filterwarnings("ignore", message="create_react_agent has been moved")


# --8<-- [start:rollout]
@tool
def lookup_capital(country: str) -> str:
    """Look up the capital city of a country."""
    return CAPITALS.get(country, f"no capital known for {country!r}")


def reward(messages: list[Any], country: str) -> float:
    """0.5 for looking up the asked country, 0.5 for an answer naming its capital."""
    looked_up = any(
        call["name"] == "lookup_capital" and call["args"].get("country") == country
        for message in messages
        if isinstance(message, AIMessage)
        for call in message.tool_calls
    )
    last = messages[-1]
    answered = isinstance(last, AIMessage) and CAPITALS[country] in str(last.content)
    return 0.5 * looked_up + 0.5 * answered


async def rollout(country: str) -> art.Trajectory:
    """One episode of the agent, as a LangGraph user writes it."""
    llm = init_chat_model(max_tokens=32)

    def choose_model(state: dict[str, Any], runtime: Any) -> Any:
        # A 135M model will not call tools unprompted: force the lookup on the first
        # turn, then let it answer.
        after_tool = isinstance(state["messages"][-1], ToolMessage)
        forced = {"type": "function", "function": {"name": "lookup_capital"}}
        return llm.bind_tools([lookup_capital], tool_choice="none" if after_tool else forced)

    agent = create_react_agent(choose_model, [lookup_capital], prompt=SYSTEM)
    result = await agent.ainvoke({"messages": [("user", f"What is the capital of {country}?")]})
    score = reward(result["messages"], country)
    return art.Trajectory(reward=score, metrics={"answered": score >= 0.5})
    # --8<-- [end:rollout]


async def main(steps: int, group_size: int, path: str, fresh: bool) -> None:
    model = art.TrainableModel(name="capitals-agent", project="langgraph", base_model=BASE_MODEL)
    run_dir = Path(path) / model.project / "models" / model.name
    if fresh and run_dir.exists():
        print(f"starting afresh (--fresh): removing the previous run in {run_dir}")
        shutil.rmtree(run_dir)
    backend = LocalBackend(path=path)
    await model.register(backend)
    if await model.get_step():
        print(
            f"resuming the run in {run_dir} at step {await model.get_step()} (--fresh starts over)"
        )
    countries = list(CAPITALS)
    try:
        # --8<-- [start:loop]
        for step in range(await model.get_step(), steps):
            batch = [countries[(2 * step + i) % len(countries)] for i in range(2)]
            groups = await art.gather_trajectory_groups(
                art.TrajectoryGroup(
                    wrap_rollout(model, rollout)(country) for _ in range(group_size)
                )
                for country in batch
            )
            rewards = [t.reward for group in groups for t in group]
            print(f"step {step + 1}: reward {sum(rewards) / len(rewards):.2f}")
            await model.train(groups, config=art.TrainConfig(learning_rate=5e-5))
        # --8<-- [end:loop]
    finally:
        await backend.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2, help="training steps to take")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per question")
    parser.add_argument("--path", default=".art", help="where models and logs are stored")
    parser.add_argument(
        "--fresh", action="store_true", help="delete the previous run and start over"
    )
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.group_size, args.path, args.fresh))
