"""Launch a GPU machine running `art serve` (needs `art-grpo[skypilot]` and a cloud), and
look at the SkyPilot task it would launch without launching anything."""

import asyncio

from art.backends.skypilot import cluster_task
from art.skypilot import SkyPilotBackend

# What initialize_cluster hands to SkyPilot: the setup and run commands, as YAML's dict.
task = cluster_task(api_key="a-generated-key", gpu="H100")
print(task["resources"], task["run"][:80])


async def main() -> None:
    backend = await SkyPilotBackend.initialize_cluster(
        cluster_name="art", gpu="H100", env_path=".env"
    )
    try:
        ...  # model.register(backend), then the loop
    finally:
        backend.down()


if __name__ == "__main__":
    asyncio.run(main())
