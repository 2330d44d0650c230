"""AutoRL from Python: inputs written by a generator model, then the whole loop."""

import asyncio

import art.autorl
from art.local import LocalBackend

TASK = "Answer customer questions about our return policy, politely and correctly."


async def write_inputs() -> None:
    inputs = await art.autorl.generate_inputs(
        TASK, 16, num_val=4, generator_model="openai/gpt-4.1-mini"
    )
    print(inputs)


async def main() -> None:
    base_model = "HuggingFaceTB/SmolLM2-135M-Instruct"
    backend = LocalBackend(path=".art")
    result = await art.autorl.train(
        TASK, base_model, judge_model=None, steps=10, backend=backend, path=".art"
    )
    print(result)
    await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
