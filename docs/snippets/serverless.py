"""Point the loop at an `art serve` on another machine (nothing is sent until register)."""

import os

import art
from art.serverless.backend import ServerlessBackend

KEY = os.environ.get("ART_API_KEY", "art-...")

backend = ServerlessBackend(base_url="http://gpu-box:8000/v1", api_key=KEY)
model = art.TrainableModel(name="agent-001", project="demo", base_model="Qwen/Qwen2.5-7B-Instruct")


async def start() -> None:
    await model.register(backend)  # loads the base model on the server
