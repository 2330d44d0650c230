"""A LoRA projection as one autograd Function: PEFT's arithmetic, PEFT's saved form."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora.layer import Linear as PeftLoraLinear

from art.runtime.trainer.lora_linear import FusedLoraLinear, with_fused_linear


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(16, 12, bias=True)
        self.up_proj = torch.nn.Linear(12, 20, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up_proj(torch.relu(self.q_proj(x)))


def _config(dropout: float = 0.0) -> LoraConfig:
    return LoraConfig(
        r=4, lora_alpha=12, lora_dropout=dropout, target_modules=["q_proj", "up_proj"]
    )


def _pair(dtype: torch.dtype = torch.float64, dropout: float = 0.0) -> tuple[PeftModel, PeftModel]:
    """PEFT's own layers and ours on the same base weights and the same (nonzero) adapter."""
    torch.manual_seed(0)
    base = _Tiny().to(dtype)
    theirs = get_peft_model(copy.deepcopy(base), _config(dropout))
    ours = get_peft_model(copy.deepcopy(base), with_fused_linear(_config(dropout)))
    with torch.no_grad():
        for (name, mine), (_, their) in zip(
            ours.named_parameters(), theirs.named_parameters(), strict=True
        ):
            if "lora_" in name:
                their.copy_(torch.randn_like(their))
                mine.copy_(their)
    return theirs, ours


def test_our_layers_replace_peft_linear_layers_only_where_asked() -> None:
    theirs, ours = _pair()
    assert type(ours.base_model.model.q_proj) is FusedLoraLinear
    assert type(theirs.base_model.model.q_proj) is PeftLoraLinear
    assert isinstance(ours.base_model.model.up_proj, PeftLoraLinear)  # PEFT code sees its class


def test_forward_and_gradients_are_peft_s() -> None:
    """Outputs and the gradients of the input and both LoRA matrices equal PEFT's, for a
    batch of sequences (3-D input), bias and no bias, in float64."""
    theirs, ours = _pair()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    weights = torch.randn(2, 5, 20, dtype=torch.float64)
    results = []
    for model in (theirs, ours):
        model.train()
        given = x.clone().requires_grad_()
        out = model(given)
        fused = type(out.grad_fn).__name__ == "_LoraProjectionBackward"
        assert fused == (model is ours)
        (out * weights).sum().backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        results.append((out.detach(), given.grad, grads))
    (out_a, x_grad_a, grads_a), (out_b, x_grad_b, grads_b) = results
    torch.testing.assert_close(out_b, out_a, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x_grad_b, x_grad_a, rtol=1e-12, atol=1e-12)
    assert grads_a.keys() == grads_b.keys()
    assert len(grads_a) == 4  # A and B of both projections
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=1e-12, atol=1e-12)


def test_a_frozen_input_gets_no_gradient_and_the_adapters_still_do() -> None:
    _, ours = _pair()
    ours(torch.randn(3, 16, dtype=torch.float64)).sum().backward()
    assert all(p.grad is not None for p in ours.parameters() if p.requires_grad)


@pytest.mark.parametrize("case", ["disabled", "merged", "dropout", "autocast", "two adapters"])
def test_where_the_fused_forward_does_not_apply_peft_s_runs(case: str) -> None:
    """A disabled or merged adapter, dropout, autocast and a second active adapter take
    PEFT's forward: the same outputs as PEFT's own layers."""
    theirs, ours = _pair(torch.float32, dropout=0.5 if case == "dropout" else 0.0)
    x = torch.randn(4, 16)
    if case == "dropout":
        theirs.train()
        ours.train()
    else:
        theirs.eval()
        ours.eval()
    if case == "merged":
        theirs.merge_adapter()
        ours.merge_adapter()
    if case == "two adapters":
        for model in (theirs, ours):
            model.add_adapter("other", _config())
            model.base_model.set_adapter(["default", "other"])
    outputs = []
    for model in (theirs, ours):
        torch.manual_seed(1)  # the same dropout masks
        if case == "disabled":
            with model.disable_adapter():
                outputs.append(model(x))
        elif case == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                outputs.append(model(x))
        else:
            outputs.append(model(x))
    assert type(outputs[1].grad_fn).__name__ != "_LoraProjectionBackward"
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-6, atol=1e-6)


def test_an_adapter_saves_as_peft_s_and_loads_into_either(tmp_path: Path) -> None:
    theirs, ours = _pair(torch.float32)
    theirs.save_pretrained(tmp_path / "theirs")
    ours.save_pretrained(tmp_path / "ours")
    config = json.loads((tmp_path / "ours" / "adapter_config.json").read_text())
    assert config == json.loads((tmp_path / "theirs" / "adapter_config.json").read_text())
    assert (tmp_path / "ours" / "adapter_model.safetensors").read_bytes() == (
        tmp_path / "theirs" / "adapter_model.safetensors"
    ).read_bytes()

    torch.manual_seed(0)
    loaded = PeftModel.from_pretrained(
        _Tiny(),
        str(tmp_path / "ours"),
        config=with_fused_linear(LoraConfig.from_pretrained(str(tmp_path / "ours"))),
    )
    assert type(loaded.base_model.model.q_proj) is FusedLoraLinear
    x = torch.randn(3, 16)
    theirs.eval()
    # float32, the rank-r product summed in another order: a few units in the last place.
    torch.testing.assert_close(loaded(x), theirs(x), rtol=1e-5, atol=1e-5)
