"""A LoRA projection as one autograd Function, through PEFT's custom-layer extension point.

PEFT's LoRA `Linear` computes `base(x) + lora_B(lora_A(x)) * scaling`: the rank-r branch
makes a tensor as wide as the layer's output, then a multiply and an add over it, and
backward runs the same passes again, with Python for three modules a projection. Here the
branch is added into the base output by one `addmm_` (`alpha=scaling`), and backward adds
the branch's part of the input gradient into the base's the same way. The arithmetic is the
same; `PeftTrainer.step` on the GRPO benchmark's groups took 4.4% less time (float32, AVX2,
2 cores, `benchmarks/RESULTS.md`, 2026-12-01).

`FusedLoraLinear` is PEFT's own LoRA `Linear` with that forward where it applies (one active
plain LoRA adapter, no dropout, not merged, a frozen `nn.Linear` base, no autocast, one
dtype); anything else (DoRA and other variants, dropout, mixed-adapter batches, a disabled
or merged adapter) takes PEFT's forward unchanged. Adapters save and load as PEFT's: the
parameters and their names are PEFT's. `with_fused_linear` registers the class on a
`LoraConfig` (`LoraConfig._register_custom_module`, PEFT's documented, experimental way to
give it custom LoRA layers); the config's saved form is unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from peft import LoraConfig
from peft.tuners.lora.layer import Linear as PeftLoraLinear


class _LoraProjection(torch.autograd.Function):
    """x W^T + b + scaling * (x A^T) B^T, with gradients for x, A and B (W and b frozen)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        scaling: float,
    ) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        # The rank-r products are taken as [r, rows]: BLAS is several times faster with r as
        # the output's rows than as its columns (MKL, float32: [190, 1536] x [1536, 8] 118
        # us, [8, 1536] x [1536, 190] 49 us).
        low_t = torch.mm(lora_a, rows.t())  # [r, rows]
        out = F.linear(rows, weight, bias)
        out.addmm_(low_t.t(), lora_b.t(), alpha=scaling)
        ctx.save_for_backward(rows, low_t, weight, lora_a, lora_b)
        ctx.scaling = scaling  # type: ignore[attr-defined]
        ctx.input_shape = x.shape  # type: ignore[attr-defined]
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, None, torch.Tensor | None, torch.Tensor | None, None]:
        rows, low_t, weight, lora_a, lora_b = ctx.saved_tensors  # type: ignore[attr-defined]
        scaling: float = ctx.scaling  # type: ignore[attr-defined]
        needs = ctx.needs_input_grad  # type: ignore[attr-defined]
        grad = grad.reshape(-1, grad.shape[-1])
        low_grad_t = torch.mm(lora_b.t(), grad.t()).mul_(scaling)  # [r, rows]
        x_grad = a_grad = b_grad = None
        if needs[0]:
            x_grad = torch.mm(grad, weight).addmm_(low_grad_t.t(), lora_a)
            x_grad = x_grad.view(ctx.input_shape)  # type: ignore[attr-defined]
        if needs[3]:
            a_grad = torch.mm(low_grad_t, rows)
        if needs[4]:
            b_grad = torch.mm(low_t, grad).mul_(scaling).t()
        return x_grad, None, None, a_grad, b_grad, None


class FusedLoraLinear(PeftLoraLinear):
    """PEFT's LoRA `Linear`, its plain single-adapter forward as one autograd Function."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        adapter = self._fused_adapter(x, args, kwargs)
        if adapter is None:
            result: torch.Tensor = super().forward(x, *args, **kwargs)
            return result
        base = self.get_base_layer()
        projected: torch.Tensor = _LoraProjection.apply(  # type: ignore[no-untyped-call]
            x,
            base.weight,
            base.bias,
            self.lora_A[adapter].weight,
            self.lora_B[adapter].weight,
            float(self.scaling[adapter]),
        )
        return projected

    def _fused_adapter(
        self, x: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> str | None:
        """The adapter the fused forward computes, or None where PEFT's forward must run."""
        if args or kwargs or self.disable_adapters or self.merged or self.fan_in_fan_out:
            return None
        if len(self.active_adapters) != 1:
            return None
        adapter = self.active_adapters[0]
        if adapter not in self.lora_A or adapter in self.lora_variant:
            return None
        if not isinstance(self.lora_dropout[adapter], torch.nn.Identity):
            return None
        base = self.get_base_layer()
        lora_a, lora_b = self.lora_A[adapter], self.lora_B[adapter]
        if type(base) is not torch.nn.Linear or lora_b.bias is not None:
            return None
        if base.weight.requires_grad or (base.bias is not None and base.bias.requires_grad):
            return None
        if torch.is_autocast_enabled(x.device.type):
            return None
        dtypes = {x.dtype, base.weight.dtype, lora_a.weight.dtype, lora_b.weight.dtype}
        return adapter if len(dtypes) == 1 else None


def with_fused_linear(config: LoraConfig) -> LoraConfig:
    """`config`, its `nn.Linear` targets made `FusedLoraLinear` layers."""
    config._register_custom_module({torch.nn.Linear: FusedLoraLinear})
    return config


__all__ = ["FusedLoraLinear", "with_fused_linear"]
