"""A minimal RL loop written for Tinker's SDK, run against `art serve` on the default model.

Each step: save the weights for sampling, sample a group per question, centre each
group's rewards, train on the completions with `importance_sampling`, take an Adam step.
"""

import os

import tinker
from tinker import types

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
QUESTIONS = [("What is 2 + 3?", "5"), ("What is 4 + 4?", "8")]


def reward(text: str, answer: str) -> float:
    """1 for the right number, less the longer the answer (so a group rarely ties)."""
    return (1.0 if answer in text else 0.0) - 0.01 * len(text.split())


def main(base_url: str, api_key: str, steps: int = 10, group_size: int = 8) -> list[float]:
    """Train for `steps`; returns each step's mean reward."""
    mean_rewards = []
    with tinker.ServiceClient(base_url=base_url, api_key=api_key) as service:
        training = service.create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
        tokenizer = training.get_tokenizer()
        sampling = types.SamplingParams(max_tokens=24, temperature=1.0)
        for step in range(steps):
            sampler = training.save_weights_and_get_sampling_client().result()
            datums, rewards = [], []
            for question, answer in QUESTIONS:
                messages = [{"role": "user", "content": question}]
                text = tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=False
                )
                prompt = tokenizer.encode(text, add_special_tokens=False)
                result = sampler.sample(
                    types.ModelInput.from_ints(prompt), group_size, sampling
                ).result()
                group = [reward(tokenizer.decode(s.tokens), answer) for s in result.sequences]
                mean = sum(group) / len(group)
                rewards += group
                for sequence, value in zip(result.sequences, group, strict=True):
                    tokens = prompt + sequence.tokens
                    pad = [0.0] * (len(prompt) - 1)  # no loss on the prompt
                    datums.append(
                        types.Datum(
                            model_input=types.ModelInput.from_ints(tokens[:-1]),
                            loss_fn_inputs={
                                "target_tokens": tokens[1:],
                                "logprobs": pad + sequence.logprobs,
                                "advantages": pad + [value - mean] * len(sequence.tokens),
                            },
                        )
                    )
            training.forward_backward(datums, "importance_sampling").result()
            training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
            mean_rewards.append(sum(rewards) / len(rewards))
            print(f"step {step}: mean reward {mean_rewards[-1]:.3f}")
        print("state:", training.save_state("final").result().path)
    return mean_rewards


if __name__ == "__main__":
    main(os.environ.get("TINKER_BASE_URL", "http://127.0.0.1:8000"), os.environ["TINKER_API_KEY"])
