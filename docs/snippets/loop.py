"""The loop on your own agent: a rollout that returns a scored Trajectory, then GRPO steps.

Replace `SCENARIOS` and `score` with your task's; everything else is what you keep.
"""

import asyncio
import re

import art
from art.local import LocalBackend

SCENARIOS = ["What is 2 + 3?", "What is 7 + 5?", "What is 9 + 4?"]


def score(answer: str | None, scenario: str) -> float:
    """Your reward: here 1.0 for the sum alone, 0.5 for the sum among other words, less a
    thousandth per character, so that among equals the shorter answer wins: a group whose
    rewards are all equal teaches the model nothing."""
    a, b = (int(n) for n in scenario.removeprefix("What is ").rstrip("?").split(" + "))
    text = (answer or "").strip().rstrip(".")
    correct = 1.0 if text == str(a + b) else 0.5 if str(a + b) in re.findall(r"\d+", text) else 0.0
    return correct - len(text) / 1000


async def rollout(model: art.Model, scenario: str) -> art.Trajectory:
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "Reply with the number only."},
            {"role": "user", "content": scenario},
        ]
    )
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=trajectory.messages(),
        max_tokens=16,
    )
    trajectory.messages_and_choices.append(completion.choices[0])  # trained on
    trajectory.reward = score(completion.choices[0].message.content, scenario)
    return trajectory


async def main(steps: int = 50) -> None:
    model = art.TrainableModel(
        name="agent-001", project="my-task", base_model="HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    backend = LocalBackend(path="./.art")
    await model.register(backend)
    for _step in range(await model.get_step(), steps):
        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(model, s) for _ in range(8)) for s in SCENARIOS),
            pbar_desc="gather",
            max_exceptions=0.1,  # up to 10% of rollouts may raise; they are kept as data
        )
        await model.train(groups, config=art.TrainConfig(learning_rate=1e-5))
    await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
