"""ART 0.5.18's training call, and what a keyword not built here gets: a ConfigError."""

import asyncio

import art
from art.local import LocalBackend


async def train_step(
    model: art.TrainableModel, backend: LocalBackend, groups: list[art.TrajectoryGroup]
) -> None:
    await model.log(groups, split="train")
    result = await backend.train(model, groups, learning_rate=5e-6, loss_fn="cispo")
    await model.log(metrics=result.metrics, step=result.step)


async def refused() -> None:
    backend = LocalBackend(path="./.art")
    model = art.TrainableModel(
        name="agent-001", project="my-task", base_model="HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    try:  # refused before anything is loaded, trained or written
        await backend.train(model, [], plot_tensors=True)
    except art.ConfigError as error:
        print(error)  # plot_tensors: True is not built in this version: in ART it plots ...
    finally:
        await backend.close()


asyncio.run(refused())
