"""A training loop written as ART 0.5.18's users write it, run here unchanged.

The loop of ART's current examples: `delete_checkpoints()` at the top of every step (from
step 0, before any validation metric exists), `model.log` of the groups, one
`backend.train(...)` call with ART's keywords, then `model.log` of what it returned. The
task is the demo's (small additions, the number alone earns most).

    python examples/art_style.py [--steps 2] [--path .art]
    python examples/art_style.py --serverless http://127.0.0.1:8000/v1  # `art serve`

With `--serverless` the same loop trains through ServerlessBackend (WANDB_API_KEY is the
server's key). ART's `ServerlessBackend.train` takes neither `loss_fn` nor
`kl_penalty_coef`, so the loop passes them to LocalBackend only, as ART's would.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
from typing import Any

import art
from art.local import LocalBackend
from art.serverless.backend import ServerlessBackend

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SYSTEM = "You are a calculator. Reply with the number only."


def reward(answer: str, expected: int) -> float:
    """1.0 for the bare correct number, 0.5 for the correct number among other text."""
    text = answer.strip().rstrip(".").strip()
    if text == str(expected):
        return 1.0
    return 0.5 if str(expected) in re.findall(r"-?\d+", text) else 0.0


async def rollout(model: art.TrainableModel, a: int, b: int) -> art.Trajectory:
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is {a} + {b}?"},
        ]
    )
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=16
    )
    trajectory.messages_and_choices.append(completion.choices[0])
    trajectory.reward = reward(completion.choices[0].message.content or "", a + b)
    return trajectory


async def main(steps: int, path: str, serverless: str | None) -> None:
    # --8<-- [start:loop]
    backend: LocalBackend | ServerlessBackend
    if serverless is None:
        backend = LocalBackend(path=path)
        options: dict[str, Any] = {"loss_fn": "cispo", "kl_penalty_coef": 0.1}
    else:
        backend = ServerlessBackend(base_url=serverless, path=path)
        options = {}
    model = art.TrainableModel(name="art-style", project="art-style", base_model=BASE_MODEL)
    await model.register(backend)
    rng = random.Random(0)
    for _ in range(await model.get_step(), steps):
        await model.delete_checkpoints()
        questions = [(rng.randint(1, 20), rng.randint(1, 20)) for _ in range(4)]
        groups = await art.gather_trajectory_groups(
            art.TrajectoryGroup(rollout(model, a, b) for _ in range(6)) for a, b in questions
        )
        await model.log(groups, split="train")
        result = await backend.train(model, groups, learning_rate=5e-5, **options)
        await model.log(metrics=result.metrics, step=result.step)
        print(f"step {result.step}: loss {result.metrics['loss/train']:.4f}")
    await backend.close()
    # --8<-- [end:loop]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2, help="training steps to take")
    parser.add_argument("--path", default=".art", help="where models and logs are stored")
    parser.add_argument("--serverless", default=None, help="an `art serve` API root (.../v1)")
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.path, args.serverless))
