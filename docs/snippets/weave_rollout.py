"""A rollout traced by Weave: each call is a Weave op whose output is the trajectory."""

import weave

import art


@weave.op
async def rollout(model: art.Model, scenario: str) -> art.Trajectory:
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": scenario}])


if __name__ == "__main__":
    art.utils.init_weave_with_wandb("my-task")  # or weave.init("my-task") yourself
