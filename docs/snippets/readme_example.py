import asyncio

import art
from art.local import LocalBackend


async def rollout(model: art.Model, question: str) -> art.Trajectory:
    messages = [{"role": "user", "content": question}]
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=messages, max_tokens=16
    )
    answer = (completion.choices[0].message.content or "").strip()
    reward = 1.0 if answer == "5" else 0.5 if "5" in answer else 0.0  # partial credit
    reward -= len(answer) / 1000  # among equals the shorter wins: a tied group teaches nothing
    return art.Trajectory(messages_and_choices=[*messages, completion.choices[0]], reward=reward)


async def main(steps: int = 10) -> None:
    model = art.TrainableModel(
        name="agent", project="demo", base_model="HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    backend = LocalBackend(path="./.art")
    await model.register(backend)
    for _ in range(await model.get_step(), steps):
        groups = await art.gather_trajectory_groups(
            [art.TrajectoryGroup(rollout(model, "2 + 3 = ?") for _ in range(8))]
        )
        await model.train(groups, config=art.TrainConfig(learning_rate=1e-5))
    await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
