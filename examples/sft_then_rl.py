"""SFT, then RL: teach the default model an answer format by example, then reward it.

The task: answer "What is a plus b?" as `[[answer: N]]`. SmolLM2-135M-Instruct never
writes that format, so a reward that pays only for it gives GRPO nothing to learn from
(every rollout scores 0). A few dozen examples of supervised fine-tuning, written as the
chat JSONL format `train_sft_from_file` reads, teach the format; RL then continues from
that checkpoint, rewarding the right sum. Held-out questions are answered greedily before
SFT, after it and after RL: the format rate and the mean reward of each are printed.

    python examples/sft_then_rl.py [--examples 80] [--rl-steps 12] [--path .art]
"""

from __future__ import annotations

# --8<-- [start:imports]
import argparse
import asyncio
import json
import random
import re
from pathlib import Path

import art
from art.local import LocalBackend
from art.utils.sft import train_sft_from_file

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
FORMAT = re.compile(r"^\[\[answer: (-?\d+)\]\]$")


def questions(seed: int, count: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(1, 60), rng.randint(1, 60)) for _ in range(count)]


def ask(a: int, b: int) -> list[art.Message]:
    return [{"role": "user", "content": f"What is {a} plus {b}?"}]


# --8<-- [end:imports]


# --8<-- [start:data]
def write_examples(path: Path, pairs: list[tuple[int, int]]) -> None:
    """One conversation per line: the question, and the answer in the format to learn."""
    with path.open("w") as file:
        for a, b in pairs:
            answer = {"role": "assistant", "content": f"[[answer: {a + b}]]"}
            file.write(json.dumps({"messages": [*ask(a, b), answer]}) + "\n")


# --8<-- [end:data]


def reward(answer: str, a: int, b: int) -> float:
    """1.0 for the right sum in the format, 0.2 for a wrong sum in it, 0 otherwise."""
    match = FORMAT.match(answer.strip())
    if match is None:
        return 0.0
    return 1.0 if int(match.group(1)) == a + b else 0.2


async def rollout(
    model: art.TrainableModel, a: int, b: int, *, greedy: bool = False
) -> art.Trajectory:
    trajectory = art.Trajectory(messages_and_choices=ask(a, b))
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=trajectory.messages(),
        max_tokens=16,
        temperature=0.0 if greedy else 1.0,
    )
    choice = completion.choices[0]
    trajectory.messages_and_choices.append(choice)
    trajectory.reward = reward(choice.message.content or "", a, b)
    return trajectory


async def evaluate(model: art.TrainableModel, pairs: list[tuple[int, int]], when: str) -> None:
    trajectories = await asyncio.gather(*(rollout(model, a, b, greedy=True) for a, b in pairs))
    answers = [t.messages()[-1].get("content") or "" for t in trajectories]
    rate = sum(bool(FORMAT.match(str(answer).strip())) for answer in answers) / len(pairs)
    mean = sum(t.reward for t in trajectories) / len(pairs)
    print(f"{when}: format rate {rate:.2f}, mean reward {mean:.2f}, e.g. {answers[0]!r}")


async def main(examples: int, rl_steps: int, path: str) -> None:
    backend = LocalBackend(path=path)
    model = art.TrainableModel(name="format", project="art-sft", base_model=BASE_MODEL)
    await model.register(backend)
    held_out = questions(seed=1, count=32)
    if await model.get_step() > 0:
        print(f"{path}/art-sft/models/format is already trained; pass another --path")
        await backend.close()
        return
    await evaluate(model, held_out, "before SFT")

    # --8<-- [start:sft]
    data = Path(path) / "format.jsonl"
    write_examples(data, questions(seed=0, count=examples))
    await train_sft_from_file(model, str(data), batch_size=8, peak_lr=1e-3)
    # --8<-- [end:sft]
    await evaluate(model, held_out, f"after SFT (step {await model.get_step()})")

    # --8<-- [start:rl]
    for step in range(rl_steps):
        groups = await art.gather_trajectory_groups(
            art.TrajectoryGroup(rollout(model, a, b) for _ in range(6))
            for a, b in questions(seed=100 + step, count=4)
        )
        await model.train(groups, config=art.TrainConfig(learning_rate=5e-5))
    # --8<-- [end:rl]
    await evaluate(model, held_out, f"after RL (step {await model.get_step()})")
    await backend.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=80, help="SFT examples to write")
    parser.add_argument("--rl-steps", type=int, default=12, help="GRPO steps after SFT")
    parser.add_argument("--path", default=".art", help="where runs are stored")
    arguments = parser.parse_args()
    Path(arguments.path).mkdir(parents=True, exist_ok=True)
    asyncio.run(main(arguments.examples, arguments.rl_steps, arguments.path))
