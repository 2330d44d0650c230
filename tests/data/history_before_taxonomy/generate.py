"""Write the old-format history.jsonl beside this file (see README.md); run on commit f6168ca."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import art
from art.local import LocalBackend

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
OUT = Path(sys.argv[1])


async def rollout(model: art.TrainableModel, n: int, reward: float) -> art.Trajectory:
    client = model.openai_client()
    messages: list[Any] = [{"role": "user", "content": f"Say the number {n}."}]
    completion = await client.chat.completions.create(
        model=model.get_inference_name(), messages=messages, max_tokens=6, logprobs=True
    )
    return art.Trajectory(
        messages_and_choices=[*messages, completion.choices[0]],
        reward=reward,
        metrics={"turns": 1, "correct": reward > 0.5},
        metadata={"scenario_id": f"s{n}"},
    )


async def main() -> None:
    root = Path(tempfile.mkdtemp()) / ".art"
    backend = LocalBackend(path=str(root), in_process=True)
    model = art.TrainableModel(name="agent", project="before-taxonomy", base_model=BASE)
    await model.register(backend)

    async def group(n: int) -> art.TrajectoryGroup:
        trajectories = [await rollout(model, n, r) for r in (0.0, 1.0, 0.5)]
        return art.TrajectoryGroup(trajectories, metrics={"hops": 2.0})

    val = [await group(1)]
    val.append(art.TrajectoryGroup([val[0].trajectories[0], RuntimeError("rollout failed")]))
    await model.log(val, split="val")
    for _ in range(2):
        await model.train(
            [await group(2), await group(3)], config=art.TrainConfig(learning_rate=1e-5)
        )
    sft = [
        art.Trajectory(
            messages_and_choices=[
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"},
            ]
        )
        for _ in range(4)
    ]
    await model.train_sft(sft, art.TrainSFTConfig(learning_rate=1e-4, batch_size=2))
    await model.log(metrics={"score": 0.5}, split="val")
    await backend.close()
    src = root / "before-taxonomy" / "models" / "agent"
    dst = OUT / "before-taxonomy" / "models" / "agent"
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("model.json", "history.jsonl"):
        shutil.copy(src / name, dst / name)
    print((dst / "history.jsonl").read_text())


asyncio.run(main())
