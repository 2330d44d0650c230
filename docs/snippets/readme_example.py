import art
from art.local import LocalBackend


async def rollout(model: art.Model, question: str) -> art.Trajectory:
    messages = [{"role": "user", "content": question}]
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=messages, max_tokens=16
    )
    reward = float((completion.choices[0].message.content or "").strip() == "5")
    return art.Trajectory(messages_and_choices=[*messages, completion.choices[0]], reward=reward)


async def main() -> None:
    model = art.TrainableModel(
        name="agent", project="demo", base_model="HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    await model.register(LocalBackend(path="./.art"))
    for _ in range(await model.get_step(), 10):
        groups = await art.gather_trajectory_groups(
            [art.TrajectoryGroup(rollout(model, "2 + 3 = ?") for _ in range(8))]
        )
        await model.train(groups, config=art.TrainConfig(learning_rate=1e-5))
