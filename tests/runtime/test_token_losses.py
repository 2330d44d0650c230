"""Tinker's losses and optimizer step on a tiny random Llama, each against a reference
computed by hand from the model's own logits (no art code in the reference)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import art
from art.core.data.errors import ConfigError
from art.runtime.trainer.peft_trainer import PeftTrainer, create_peft_model
from art.runtime.trainer.token_losses import LOSS_CONFIG, TokenDatum, check_loss

VOCAB = 48


def tiny_trainer() -> PeftTrainer:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = create_peft_model(LlamaForCausalLM(config), art.dev.PeftArgs(r=4, lora_alpha=8), seed=0)
    # A fresh LoRA B is zero, which would make every adapter gradient but B's vanish.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)
    return PeftTrainer(
        model, None, init_args=art.dev.InitArgs(), trainer_args=art.dev.TrainerArgs()
    )  # type: ignore[arg-type]


def datum(loss: str, seed: int, length: int = 9) -> TokenDatum:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (length + 1,), generator=generator).tolist()
    inputs: dict[str, list[float]] = {"target_tokens": [float(t) for t in tokens[1:]]}
    if loss == "cross_entropy":
        inputs["weights"] = [0.0, 0.0, *torch.rand(length - 2, generator=generator).tolist()]
    else:
        # Sampler logprobs near the policy's (about -log VOCAB), so ratios fall on both
        # sides of the clip range.
        inputs["logprobs"] = (-3.87 + 0.6 * torch.randn(length, generator=generator)).tolist()
        inputs["advantages"] = [0.0, 0.0, *torch.randn(length - 2, generator=generator).tolist()]
    return TokenDatum(tokens[:-1], inputs)


def reference(
    trainer: PeftTrainer, data: list[TokenDatum], loss: str, config: dict[str, float]
) -> tuple[list[list[float]], float, dict[str, torch.Tensor]]:
    """Logprobs, summed loss and gradients from the full forward pass, by the formulas."""
    model = copy.deepcopy(trainer.model)
    model.eval()
    total = torch.zeros(())
    logprobs_out = []
    for item in data:
        logits = model(input_ids=torch.tensor([item.input_ids])).logits[0].float()
        targets = torch.tensor(item.inputs["target_tokens"]).long()
        logprobs = torch.log_softmax(logits, -1)[torch.arange(len(targets)), targets]
        logprobs_out.append(logprobs.tolist())
        if loss == "cross_entropy":
            total = total - (torch.tensor(item.inputs["weights"]) * logprobs).sum()
            continue
        old = torch.tensor(item.inputs["logprobs"])
        advantage = torch.tensor(item.inputs["advantages"])
        ratio = torch.exp(logprobs - old)
        low, high = config.get("clip_low_threshold"), config.get("clip_high_threshold")
        if loss == "importance_sampling":
            total = total - (ratio * advantage).sum()
        elif loss == "ppo":
            clipped = ratio.clamp(low, high)
            total = total - torch.minimum(ratio * advantage, clipped * advantage).sum()
        else:  # cispo
            total = total - (ratio.clamp(low, high).detach() * logprobs * advantage).sum()
    total.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logprobs_out, float(total.detach()), grads


@pytest.mark.parametrize(
    ("loss", "config"),
    [
        ("cross_entropy", {}),
        ("importance_sampling", {}),
        ("ppo", {}),
        ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05}),
        ("cispo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.1}),
    ],
)
def test_each_loss_matches_the_reference_in_value_logprobs_and_gradients(
    loss: str, config: dict[str, float]
) -> None:
    trainer = tiny_trainer()
    resolved = check_loss(loss, config)
    data = [datum(loss, seed, length=6 + 4 * seed) for seed in range(3)]  # padded together
    want_logprobs, want_loss, want_grads = reference(trainer, data, loss, resolved)
    outputs, metrics = trainer.forward_backward(data, loss, resolved, backward=True)

    assert metrics["loss:sum"] == pytest.approx(want_loss, rel=1e-5, abs=1e-6)
    for got, want in zip(outputs, want_logprobs, strict=True):
        assert got["logprobs"] == pytest.approx(want, abs=1e-5)
    assert sum(sum(o["elementwise_loss"]) for o in outputs) == pytest.approx(want_loss, abs=1e-5)
    grads = {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}
    assert set(grads) == set(want_grads)
    assert want_grads, "the reference has gradients"
    for name, want in want_grads.items():
        torch.testing.assert_close(grads[name], want, rtol=1e-4, atol=1e-6)
    if loss == "ppo":  # the clip acted somewhere, or this case checks nothing of it
        ratios = [
            torch.exp(torch.tensor(w) - torch.tensor(d.inputs["logprobs"]))
            for w, d in zip(want_logprobs, data, strict=True)
        ]
        flat = torch.cat(ratios)
        assert (
            (flat < resolved["clip_low_threshold"]) | (flat > resolved["clip_high_threshold"])
        ).any()


def test_gradients_add_up_over_calls_until_the_optimizer_step() -> None:
    trainer = tiny_trainer()
    data = [datum("cross_entropy", seed) for seed in range(2)]
    trainer.forward_backward(data[:1], "cross_entropy", {}, backward=True)
    trainer.forward_backward(data[1:], "cross_entropy", {}, backward=True)
    split = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    _, _, want = reference(trainer, data, "cross_entropy", {})
    for name, grad in want.items():
        torch.testing.assert_close(split[name], grad, rtol=1e-4, atol=1e-6)

    # The step is AdamW with Tinker's parameters, on the summed gradients, which it clears.
    expected = copy.deepcopy(trainer.model)
    params = [p for p in expected.parameters() if p.requires_grad]
    for name, copied in zip(
        (n for n, p in trainer.model.named_parameters() if p.requires_grad),
        params,
        strict=True,
    ):
        copied.grad = split[name].clone()
    torch.nn.utils.clip_grad_norm_(params, 0.5)
    reference_adam = torch.optim.AdamW(
        params, lr=1e-2, betas=(0.8, 0.9), eps=1e-7, weight_decay=0.1
    )
    reference_adam.step()
    metrics = trainer.optim_step(1e-2, 0.8, 0.9, 1e-7, 0.1, 0.5)
    assert metrics["grad_norm"] > 0.5  # so the clip acted
    got = [p for p in trainer.model.parameters() if p.requires_grad]
    for mine, theirs in zip(got, params, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7)
        assert mine.grad is None


def test_forward_alone_leaves_no_gradient() -> None:
    trainer = tiny_trainer()
    outputs, _ = trainer.forward_backward(
        [datum("cross_entropy", 0)], "cross_entropy", {}, backward=False
    )
    assert len(outputs[0]["logprobs"]) == 9
    assert all(p.grad is None for p in trainer.model.parameters())


def test_saved_state_reloads_to_the_same_next_loss(tmp_path: Path) -> None:
    trainer = tiny_trainer()
    data = [datum("importance_sampling", seed) for seed in range(2)]
    adam = (1e-2, 0.9, 0.95, 1e-12, 0.0, 0.0)
    trainer.forward_backward(data, "importance_sampling", {}, backward=True)
    trainer.optim_step(*adam)
    trainer.save(tmp_path / "state")
    trainer.forward_backward(data, "importance_sampling", {}, backward=True)
    trainer.optim_step(*adam)
    _, after = trainer.forward_backward(data, "importance_sampling", {}, backward=False)

    trainer.load(tmp_path / "state", with_optimizer=True)
    trainer.forward_backward(data, "importance_sampling", {}, backward=True)
    trainer.optim_step(*adam)
    _, again = trainer.forward_backward(data, "importance_sampling", {}, backward=False)
    assert again["loss:sum"] == after["loss:sum"]

    # Without the optimizer's moments the same step lands elsewhere.
    trainer.load(tmp_path / "state", with_optimizer=False)
    trainer.forward_backward(data, "importance_sampling", {}, backward=True)
    trainer.optim_step(*adam)
    _, fresh = trainer.forward_backward(data, "importance_sampling", {}, backward=False)
    assert fresh["loss:sum"] != after["loss:sum"]


@pytest.mark.parametrize("loss", ["dro", "gspo", "stable_reinforce", "nope"])
def test_losses_not_served_are_refused_by_name(loss: str) -> None:
    with pytest.raises(ConfigError, match=loss):
        check_loss(loss, None)


def test_bad_inputs_and_config_are_refused_naming_the_field() -> None:
    trainer = tiny_trainer()
    with pytest.raises(ConfigError, match=r"loss_fn_config\.epsilon"):
        check_loss("ppo", {"epsilon": 0.1})
    good = datum("importance_sampling", 0)
    missing = TokenDatum(
        good.input_ids, {k: v for k, v in good.inputs.items() if k != "advantages"}
    )
    with pytest.raises(ConfigError, match=r"data\[0\]\.loss_fn_inputs\.advantages"):
        trainer.forward_backward([missing], "importance_sampling", {}, backward=True)
    short = TokenDatum(good.input_ids, {**good.inputs, "logprobs": good.inputs["logprobs"][:-1]})
    with pytest.raises(ConfigError, match=r"data\[1\]\.loss_fn_inputs\.logprobs"):
        trainer.forward_backward([good, short], "importance_sampling", {}, backward=True)
    assert all(p.grad is None for p in trainer.model.parameters())  # checked before any pass
    assert set(LOSS_CONFIG) == {"cross_entropy", "importance_sampling", "ppo", "cispo"}


def test_a_lora_on_the_lm_head_saves_its_own_weights_not_the_bases_embeddings(
    tmp_path: Path,
) -> None:
    """PEFT's default wrote the base's (tied) embeddings into every such checkpoint."""
    from safetensors.torch import load_file

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    args = art.dev.PeftArgs(r=4, lora_alpha=8, target_modules=("q_proj", "lm_head"))
    model = create_peft_model(LlamaForCausalLM(config), args, seed=0)
    trainer = PeftTrainer(
        model,
        None,  # type: ignore[arg-type]
        init_args=art.dev.InitArgs(),
        trainer_args=art.dev.TrainerArgs(),
    )
    trainer.save(tmp_path / "checkpoint")
    saved = load_file(tmp_path / "checkpoint" / "adapter_model.safetensors")
    assert any("lm_head.lora_" in key for key in saved)
    assert all(".lora_" in key for key in saved), sorted(saved)
