"""The trainer and our engine on a CUDA GPU (`make gpu-check`); skipped without one.

A small randomly initialised Llama with the default model's tokenizer stands in for a
real model, so no weights need to reach the GPU machine: `make gpu-wheels` copies the
tokenizer into `.gpu/tokenizer`, and ART_TOKENIZER_DIR names it there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import save_random_llama, tokenizer_dir
from openai.types.chat.chat_completion import Choice

import art

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine"),
]


@pytest.fixture(scope="module")
def random_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-layer Llama, randomly initialised, saved with the default tokenizer."""
    directory = tmp_path_factory.mktemp("random-llama")
    return save_random_llama(directory, tokenizer_dir(), hidden_size=256, layers=4)


def _completion_logprob(model: Any, prompt: list[int], tokens: list[int]) -> float:
    ids = torch.tensor([prompt + tokens], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])
    return float(picked.sum())


def test_a_grpo_step_on_cuda_raises_the_rewarded_completion(random_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from art.runtime.trainer.peft_trainer import PeftTrainer, create_peft_model

    tokenizer = AutoTokenizer.from_pretrained(random_model_dir)
    base = AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.bfloat16).cuda()
    model = create_peft_model(base, art.dev.PeftArgs(r=8, lora_alpha=16), seed=0)
    trainer = PeftTrainer(
        model, tokenizer, init_args=art.dev.InitArgs(), trainer_args=art.dev.TrainerArgs()
    )
    assert model.device.type == "cuda"
    prompt = list(tokenizer("Name a colour:", add_special_tokens=False)["input_ids"])
    generator = torch.Generator().manual_seed(1)
    completions = [torch.randint(100, 1000, (6,), generator=generator).tolist() for _ in range(4)]
    before = [_completion_logprob(model, prompt, tokens) for tokens in completions]
    group = art.TrajectoryGroup(
        art.Trajectory(
            messages_and_choices=[
                {"role": "user", "content": "Name a colour:"},
                Choice.model_validate(
                    {
                        "index": 0,
                        "finish_reason": "length",
                        "message": {"role": "assistant", "content": tokenizer.decode(tokens)},
                        "prompt_token_ids": prompt,
                        "token_ids": tokens,
                        "token_logprobs": [before[i] / len(tokens)] * len(tokens),
                    }
                ),
            ],
            reward=1.0 if i == 0 else 0.0,
        )
        for i, tokens in enumerate(completions)
    )

    metrics = trainer.step([group], art.TrainConfig(learning_rate=1e-3), art.dev.TrainConfig())

    after = [_completion_logprob(model, prompt, tokens) for tokens in completions]
    assert metrics["sequences_trained"] == 4
    assert after[0] > before[0], (before, after)
    assert all(new < old for old, new in zip(before[1:], after[1:], strict=True)), (before, after)


async def test_the_loop_runs_on_cuda_through_a_local_backend(
    random_model_dir: Path, tmp_path: Path
) -> None:
    from art.local import LocalBackend

    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    try:
        model = art.TrainableModel(
            name="cuda",
            project="gpu-check",
            base_model=str(random_model_dir),
            _internal_config=art.dev.InternalModelConfig(engine="transformers"),
        )
        await model.register(backend)
        client = model.openai_client()
        completion = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=[{"role": "user", "content": "Say something."}],
            max_tokens=8,
            n=4,
            temperature=1.0,
        )
        trajectories = [
            art.Trajectory(
                messages_and_choices=[{"role": "user", "content": "Say something."}, choice],
                reward=float(i == 0),
            )
            for i, choice in enumerate(completion.choices)
        ]
        await model.train([art.TrajectoryGroup(trajectories)], config=art.TrainConfig())
        assert await model.get_step() == 1
        again = await client.chat.completions.create(
            model=f"{model.get_inference_name()}@1",
            messages=[{"role": "user", "content": "Say something."}],
            max_tokens=4,
            temperature=0,
        )
        assert again.choices[0].message.content is not None
        service: Any = backend.service
        (base,) = service._bases.values()
        assert base.model.device.type == "cuda"
    finally:
        await backend.close()
