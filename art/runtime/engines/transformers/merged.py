"""A plain copy of the base model with one LoRA adapter merged into it, for sampling.

PEFT's LoRA wrapper runs about six extra small ops around every adapted projection, at
every decode step: with seven projections in each of the default model's 30 layers that
is most of a one-request decode step's time on a CPU. The trainer needs the wrapped
model (the adapter's own parameters take the gradient), so the engine samples from a
second, plain copy whose adapted weights hold W0 + delta of the adapter being served,
merged again whenever that adapter changes (after each training step).

Costs and limits: the copy's memory (its linear layers' weights once more: the
embeddings, the LM head and the norms, which no merge writes, are the served model's own
tensors, `share_unmerged`), and a merge (a few passes over the adapted weights; 0.15 s
for the default model on one core) when the served adapter changes. Where the copy's
layers are blocked for oneDNN (`packed.py`), a merge blocks W0 + delta afresh into
them (89-95 ms against 54 for the default model, AVX2, two cores). In float32 the
copy's logprobs equal the wrapped model's. In bf16 an update smaller than half a bf16
step of a weight is rounded away in the copy; measured against the trainer's own forward
pass, sampled tokens' logprobs differ by 0.044 on average through the copy and by 0.040
through the adapter's modules (benchmarks/sampler_fidelity.py; bf16 decode with a KV
cache is not the trainer's full-sequence pass either), and the sampler's logprobs are
always those of the weights that sampled, which is what the trainer's importance ratio
needs.
"""

from __future__ import annotations

from typing import Any

import torch

from .packed import BlockedGroup, PackedLinear

_STALE = object()  # nothing merged yet, or the adapters changed since


class MergedCopy:
    """`plain` (a model without adapters) holding the weights of one adapter of `peft_model`.

    `peft_model` may still be a plain model (no adapter loaded yet); the engine sets it
    again once its first adapter wraps it.
    """

    def __init__(self, peft_model: Any, plain: Any) -> None:
        self.peft_model = peft_model
        self.plain = plain
        self._merged: object = _STALE
        self._targets = dict(plain.named_modules())

    def model_for(self, adapter: str | None) -> Any:
        """The plain copy with `adapter` (None: no adapter) merged in."""
        if self._merged is _STALE or self._merged != adapter:
            self._merge(adapter)
        return self.plain

    def invalidate(self) -> None:
        """The adapters changed (a training step, an adapter loaded): merge again when next used."""
        self._merged = _STALE

    @torch.no_grad()
    def _merge(self, adapter: str | None) -> None:
        from peft.tuners.lora import LoraLayer

        self._merged = _STALE  # stays so if a merge fails halfway
        if not hasattr(self.peft_model, "get_base_model"):  # no adapter loaded yet
            self._merged = adapter
            return
        # Found again each time: a model registered later may have adapted other modules.
        sources = dict(plain_model(self.peft_model).named_modules())
        pairs: list[tuple[Any, Any]] = [
            (module, self._targets[name])
            for name, module in sources.items()
            if isinstance(module, LoraLayer)
        ]
        groups: dict[int, BlockedGroup] = {}  # blocked together: loaded once, below
        for lora, target in pairs:
            weight = lora.get_base_layer().weight
            if isinstance(target, PackedLinear) and target.group is not None:
                groups[id(target.group)] = target.group
            elif isinstance(target, PackedLinear):  # blocked afresh from W0 + delta
                target.load(_merged_weight(lora, adapter))
            elif adapter is None or adapter not in lora.lora_A:
                target.weight.copy_(weight)
            else:
                # In place: W0 + delta computed in float32 (the promoted type of an
                # in-place add) and rounded once to the copy's dtype, with no temporary
                # of the weight's size besides PEFT's delta.
                target.weight.copy_(weight)
                target.weight.add_(lora.get_delta_weight(adapter))
        for group in groups.values():  # every member, adapted or not, blocked afresh
            group.load([_merged_weight(sources[name], adapter) for name in group.names])
        self._merged = adapter


def _merged_weight(module: Any, adapter: str | None) -> torch.Tensor:
    """W0 + delta of `module` (a PEFT LoRA layer) for `adapter`; W0 where `adapter` is None
    or does not adapt it, or where `module` is a plain linear layer."""
    from peft.tuners.lora import LoraLayer

    lora: Any = module  # PEFT's layer classes are typed loosely
    if not isinstance(module, LoraLayer):
        weight: torch.Tensor = lora.weight
        return weight
    weight = lora.get_base_layer().weight
    if adapter is None or adapter not in lora.lora_A:
        return weight
    merged: torch.Tensor = weight + lora.get_delta_weight(adapter)
    return merged


def share_unmerged(plain: Any, base: Any) -> None:
    """Give `plain` the frozen tensors of `base` (same architecture) wherever no merge writes
    (every parameter but the linear layers', the LM head's aside), and its linear layers'
    weights memory of their own.

    A freshly loaded copy's tensors lie in a memory map of the weights file that its
    `base` has mapped as well: the two maps count twice in the RSS, and once the merges
    write a weight it exists three times. With nothing left pointing into the copy's map
    it is unmapped: on the default model in float32 the copy then holds 0.43 GB (its
    linear layers) instead of the file's 0.54 GB on top of what merges and fusing made.
    """
    head = plain.get_output_embeddings()
    theirs = dict(base.named_modules())
    for name, module in plain.named_modules():
        other = theirs.get(name)
        sources = dict(other.named_parameters(recurse=False)) if other is not None else {}
        for key, mine in list(module.named_parameters(recurse=False)):
            source = sources.get(key)
            shareable = (
                (module is head or not isinstance(module, torch.nn.Linear))
                and source is not None
                and not source.requires_grad
                and (source.shape, source.dtype, source.device)
                == (mine.shape, mine.dtype, mine.device)
            )
            if shareable:
                module.register_parameter(key, source)
            else:
                mine.data = mine.data.clone()


def plain_model(model: Any) -> Any:
    """The transformers model beneath a PEFT model (`model` itself if plain). Not PEFT's
    `get_base_model()`: that reads the active adapter's config, and a PEFT model whose
    adapters were all unloaded has none."""
    base = getattr(model, "base_model", None)
    return base.model if hasattr(model, "peft_config") and base is not None else model


def mergeable(target_modules: tuple[str, ...]) -> bool:
    """Whether adapters on these modules can be merged into the engine's sampling copy (not
    the embeddings or LM head: in the copy they may be one tied tensor)."""
    return not {"embed_tokens", "lm_head", "wte", "embed_in"} & set(target_modules)


__all__ = ["MergedCopy", "mergeable", "plain_model", "share_unmerged"]
