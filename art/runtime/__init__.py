"""The model service shared by every backend that serves models: `LocalBackend`,
`RayBackend` and `art serve` each compose it; none carries a copy.

- `endpoint/`: the OpenAI-compatible HTTP API, its requests and its responses.
- `engines/`: inference engines behind the one `Engine` protocol (transformers, vllm).
- `service/`: `ModelService`: the registry, checkpoints, routing and the training driver.
- `trainer/`: the PEFT and Unsloth trainers with their loss, advantages and tokenizing.
- `chat_format.py`: chat and tool rendering, and tool calls parsed out of sampled text.
- `models.py`: base models found and loaded, the embedded default model included.
- `process.py`: the service in a child process that dies with its parent, and its proxy.
- `torch_thread.py`: the one thread a process runs its torch work on.

It imports `art.core` and nothing from `art.backends` or `art.serve`.
"""
