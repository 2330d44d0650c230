"""The vLLM engine: vLLM's server in a child process, fed token ids.

- `engine.py`: `VLLMEngine` and `start_vllm_engine`.
- `server.py`: the child process, from `.venv-vllm` or `ART_VLLM_PYTHON`.
- `launcher.py`: runs vLLM's server so it dies with the process that started it.
"""
