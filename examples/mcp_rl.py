"""MCP•RL on this machine: train the default model to use an MCP server's tools.

1. Start the notes server of `examples/mcp_notes_server.py` over stdio and discover
   its tools and resources.
2. Generate scenarios (tasks the tools can solve) with the model itself as the
   generator, through its OpenAI-compatible endpoint and structured output.
3. Each step: roll out every scenario several times through the tool loop, rank each
   group with RULER (the judge sees the server's tools; equal scores are broken by a
   clean finish, then brevity: `TIE_BREAK`), and train on the ranks. Each
   rollout runs on its own notes server, started from the seed notes
   (`fresh_sessions=True` with `--db :memory:`), so the rollouts of a group are compared
   from the same state and no rollout sees what another added or deleted.
4. Score the trained model on held-out scenarios without training (`evaluate`).

By default the judge is the untrained base model, served beside ours by the same
LocalBackend; `--judge openai/gpt-4.1-mini` (with OPENAI_API_KEY) uses a real one.

    python examples/mcp_rl.py [--steps 2] [--path .art] [--judge MODEL] [--fresh]

A second start resumes the run from its last checkpoint; `--fresh` deletes it first.
"""

from __future__ import annotations

# --8<-- [start:imports]
import argparse
import asyncio
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import art
from art.local import LocalBackend
from art.mcp import (
    MCPRolloutConfig,
    MCPSession,
    evaluate,
    generate_scenarios,
    mcp_rollout,
    reward_scorer,
    ruler_scorer,
)

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SERVER = Path(__file__).resolve().parent / "mcp_notes_server.py"
# --8<-- [end:imports]
# --8<-- [start:config]
# "required": every turn is a tool call, so even a 135M model exercises the tools; the
# built-in complete_task call is how it ends a rollout early.
ROLLOUT = MCPRolloutConfig(max_turns=3, max_tokens=64, tool_choice="required", fresh_sessions=True)
RUBRIC = (
    "Score higher the agent that calls tools which fit the task, with sensible "
    "arguments, avoids tool errors, and finishes with complete_task and a correct summary."
)
# --8<-- [end:config]


# --8<-- [start:reward]
def completed_cleanly(trajectory: art.Trajectory) -> float:
    """Held-out reward: 1 for a rollout that called complete_task without a tool error."""
    return float(bool(trajectory.metrics["completed"]) and trajectory.metrics["tool_errors"] == 0)


# A judge as small as the default model scores a group's rollouts alike, and a group of
# equal rewards teaches GRPO nothing. What the rubric also asks, a clean finish and then a
# shorter rollout, breaks such ties; at most 0.01, it leaves a real judge's ranking alone.
TIE_BREAK = 0.01


def tie_break(trajectory: art.Trajectory) -> float:
    """From 0 to 1: half for finishing cleanly, half for brevity (none at 2,000 characters)."""
    written = sum(
        len(str(m.get("content") or "")) + len(str(m.get("tool_calls") or ""))
        for m in trajectory.messages()
        if m["role"] == "assistant"
    )
    return 0.5 * completed_cleanly(trajectory) + 0.5 * (1 - min(written, 2000) / 2000)


# --8<-- [end:reward]


def spread(groups: list[art.TrajectoryGroup]) -> int:
    """Groups whose rollouts the judge scored differently (before the tie-break)."""
    return sum(len({t.metrics["ruler_score"] for t in group}) > 1 for group in groups)


async def main(arguments: argparse.Namespace) -> None:
    started = time.monotonic()
    run_dir = Path(arguments.path) / "art-mcp" / "models" / "notes-agent"
    if arguments.fresh and run_dir.exists():
        print(f"starting afresh (--fresh): removing the previous run in {run_dir}")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    backend = LocalBackend(path=arguments.path)
    model = art.TrainableModel(name="notes-agent", project="art-mcp", base_model=BASE_MODEL)
    await model.register(backend)
    if await model.get_step():
        print(
            f"resuming the run in {run_dir} at step {await model.get_step()} (--fresh starts over)"
        )

    # --8<-- [start:scenarios]
    judge_model = arguments.judge or f"openai/{BASE_MODEL}"
    # Room for the judge's analysis, then an entry per rollout.
    judge_params: dict[str, Any] = {"max_tokens": 160 * arguments.group_size + 160}
    if arguments.judge is None:
        judge_params |= {
            "base_url": model.inference_base_url,
            "api_key": model.inference_api_key,
            "temperature": 0.0,
        }
    judge = ruler_scorer(judge_model, judge_params, RUBRIC, swallow_exceptions=True)

    async def score(group: art.TrajectoryGroup) -> art.TrajectoryGroup | None:
        judged = await judge(group)
        for trajectory in judged or []:
            trajectory.reward += TIE_BREAK * tie_break(trajectory)
        return judged

    # Opened once to discover the tools; each rollout starts its own copy (ROLLOUT).
    server = MCPSession.stdio(sys.executable, [str(SERVER), "--db", ":memory:"])
    async with server:
        tools = await server.list_tools()
        resources = await server.list_resources()
        print(f"tools: {', '.join(t.name for t in tools)}; resources: {len(resources)}")

        count = arguments.steps * arguments.groups + arguments.val
        print(f"generating {count} scenarios with {BASE_MODEL}")
        scenarios = await generate_scenarios(
            tools,
            resources,
            num_scenarios=count,
            generator_model=model,
            custom_instructions="Keep each task to one short sentence about the user's notes.",
            max_task_length=120,
        )
        train, val = scenarios.split(count - arguments.val)
        # --8<-- [end:scenarios]

        failures = 0
        while (step := await model.get_step()) < arguments.steps:
            batch = train.scenarios[step * arguments.groups : (step + 1) * arguments.groups]
            # --8<-- [start:step]
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(
                        mcp_rollout(model, scenario, server, ROLLOUT)
                        for _ in range(arguments.group_size)
                    )
                    for scenario in batch
                ),
                pbar_desc=f"step {step + 1}/{arguments.steps}",
                after_each=score,
            )
            if not groups:
                failures += 1
                if failures == 3:
                    raise SystemExit("the judge could not score a group three times in a row")
                print(f"step {step + 1}: the judge could score no group; rolling out again")
                continue
            failures = 0
            await model.train(groups, config=art.TrainConfig(learning_rate=arguments.learning_rate))
            # --8<-- [end:step]
            trajectories = [t for g in groups for t in g]
            calls = sum(float(t.metrics["tool_calls"]) for t in trajectories)
            errors = sum(float(t.metrics["tool_errors"]) for t in trajectories)
            print(
                f"step {step + 1}: {len(groups)} groups judged ({spread(groups)} told apart "
                "by the judge), mean RULER score "
                f"{sum(float(t.metrics['ruler_score']) for t in trajectories) / len(trajectories):.2f}, "
                f"{calls / len(trajectories):.1f} tool calls per rollout, "
                f"{errors / max(calls, 1):.0%} of them errors"
            )

        # --8<-- [start:evaluate]
        evaluation = await evaluate(
            model, val, server, reward_scorer(completed_cleanly), config=ROLLOUT, pbar_desc="val"
        )
        await model.log(evaluation.groups, split="val")
        for result in evaluation.results:
            print(f"  val {result.mean_reward:.0f}  {result.task}")
        print(f"held-out: {evaluation.mean_reward:.2f} of rollouts completed without tool errors")
        # --8<-- [end:evaluate]

    await backend.close()
    print(f"trained to step {step} in {time.monotonic() - started:.0f}s; run stored in {run_dir}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=8, help="training steps")
    parser.add_argument("--groups", type=int, default=2, help="scenarios per step")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per scenario")
    parser.add_argument("--val", type=int, default=2, help="held-out scenarios")
    parser.add_argument("--judge", default=None, help="a LiteLLM model; default: the base model")
    parser.add_argument("--path", default=".art", help="where the run is stored")
    parser.add_argument(
        "--fresh", action="store_true", help="delete the previous run and start over"
    )
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    asyncio.run(main(parser.parse_args()))
