"""A model unloaded from its service (`art serve` deletes one so) leaves the base serving.

With the last adapter of a base unloaded, requests for the base are answered and the next
model registered on it loads and samples, in shared mode (the engine samples from the
trainer's PEFT model) and in dedicated mode (the engine's own copy loads checkpoints).
"""

from __future__ import annotations

import art
from art.local import LocalBackend
from art.runtime.service.model_service import ModelService

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEDICATED = art.dev.InternalModelConfig(trainer_gpu_ids=[], inference_gpu_ids=[])
HELLO = [{"role": "user", "content": "Say hello."}]


async def test_in_shared_mode(shared_backend: LocalBackend, unique_project: str) -> None:
    await the_base_serves_and_a_new_model_loads_after_the_last_unload(
        shared_backend, None, unique_project
    )


async def test_in_dedicated_mode(dedicated_backend: LocalBackend, unique_project: str) -> None:
    await the_base_serves_and_a_new_model_loads_after_the_last_unload(
        dedicated_backend, DEDICATED, unique_project
    )


async def the_base_serves_and_a_new_model_loads_after_the_last_unload(
    backend: LocalBackend, config: art.dev.InternalModelConfig | None, project: str
) -> None:
    def model(name: str) -> art.TrainableModel:
        return art.TrainableModel(
            name=name, project=project, base_model=BASE, _internal_config=config
        )

    first = model("first")
    await first.register(backend)
    client = first.openai_client()
    await client.chat.completions.create(
        model=first.get_inference_name(), messages=HELLO, max_tokens=2
    )
    service = backend.service
    assert isinstance(service, ModelService)
    for loaded_project, run in service.loaded():  # this base's last adapter goes with them
        service.unload(loaded_project, run)

    answer = await client.chat.completions.create(model=BASE, messages=HELLO, max_tokens=2)
    assert answer.usage is not None
    assert answer.usage.completion_tokens > 0
    second = model("second")
    await second.register(backend)
    answer = await client.chat.completions.create(
        model=second.get_inference_name(), messages=HELLO, max_tokens=2
    )
    assert answer.usage is not None
    assert answer.usage.completion_tokens > 0
