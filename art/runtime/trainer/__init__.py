"""The trainer and its maths: GRPO-family steps on a LoRA adapter.

- `peft_trainer.py`: `PeftTrainer`, the training recipe read top to bottom.
- `unsloth_trainer.py`, `unsloth_worker.py`: the Unsloth trainer: a `PeftTrainer` on
  Unsloth's model in a process of its own (`.venv-unsloth`), and its driver here.
- `loss.py`, `advantages.py`: the objective, as pure functions.
- `tokenize.py`: trajectories to training sequences with the sampled token ids.
- `batching.py`, `shared_prefix.py`: token-budget micro-batches; shared prompts trained once.
- `logprobs.py`, `memory.py`: chunked logprobs; what a step will take and took.
"""
