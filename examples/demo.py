"""`make demo`: the documented client loop on this machine.

Rollouts, grouping, exception counting and logging run for real against LocalBackend;
training steps arrive with the LocalBackend trainer, and until then this demo stops
after logging and says so.
"""

from __future__ import annotations

import asyncio
import random
import tempfile

from openai.types.chat.chat_completion import Choice

import art
from art.local import LocalBackend

SCENARIOS = [(a, b) for a in range(2, 6) for b in range(3, 5)]


async def rollout(
    model: art.TrainableModel, scenario: tuple[int, int], rng: random.Random
) -> art.Trajectory:
    a, b = scenario
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "Answer with the number only."},
            {"role": "user", "content": f"What is {a} + {b}?"},
        ]
    )
    # A stand-in policy until the model is served: right about half the time.
    guess = a + b + rng.choice([0, 0, 1, -1])
    trajectory.messages_and_choices.append(
        Choice.model_validate(
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": str(guess)},
            }
        )
    )
    trajectory.reward = 1.0 if guess == a + b else 0.0
    return trajectory


async def main() -> None:
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as path:
        model = art.TrainableModel(
            name="demo", project="demo", base_model="HuggingFaceTB/SmolLM2-135M-Instruct"
        )
        await model.register(LocalBackend(path=path))
        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(model, s, rng) for _ in range(4)) for s in SCENARIOS),
            pbar_desc="gather",
        )
        await model.log(groups, split="train")
        rewards = [t.reward for g in groups for t in g]
        print(
            f"logged {len(rewards)} trajectories in {len(groups)} groups, mean reward {sum(rewards) / len(rewards):.2f}"
        )
        try:
            await model.train(groups, config=art.TrainConfig(learning_rate=1e-5))
        except NotImplementedError as error:
            print(f"training: {error}")


if __name__ == "__main__":
    asyncio.run(main())
