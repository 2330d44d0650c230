"""The running batch: prefilling new requests into it and decoding it one token a step.

Row i of every tensor of a `Batch` is `rows[i]`. New requests are prefilled as a batch of
their own and joined to the running rows (the shorter KV cache left-padded and masked);
finished rows leave at the next step, and the left padding no remaining row attends to is
cut off.

Prefill shares work: rows with the same prompt (a request's `n` samples, a group's
rollouts sent together) share one prefilled row, copied to each of them, and prompts
that start with a cached prefix (a system prompt, a conversation's earlier turns) take
its keys and values from the prefix cache (`prefix_cache.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from . import kv_cache, sampling
from .decode_graphs import StaticDecoder
from .lean_decode import LeanDecoder
from .prefix_cache import LayerKV, PrefixCache, Prompt
from .rows import Request, Row, RowStepper, new_rows


@dataclass
class Batch:
    """The running rows and their decoding state, row i of every tensor being rows[i]."""

    rows: list[Row]
    cache: Any  # a transformers Cache of kv_cache.GrowingLayer
    attention: torch.Tensor  # (rows, cached length)
    next_position: torch.Tensor  # (rows, 1)
    logits: torch.Tensor  # (rows, vocab): the distribution of each row's next token


class BatchDecoder:
    """Prefills and decodes batches with `model` (set per batch: the adapter's weights)."""

    def __init__(
        self,
        stepper: RowStepper,
        pad_id: int,
        prefixes: PrefixCache,
        lean: LeanDecoder | StaticDecoder | None,
    ) -> None:
        self.stepper = stepper
        self.pad_id = pad_id
        self.prefixes = prefixes
        # Decode steps of the merged copy without transformers' module stack (on a GPU
        # replayed from CUDA graphs).
        self.lean = lean
        self.model: Any = None  # what the running batch calls
        # The draws' weights, kept while batches run (`sampling.WeightsBuffer`).
        self.weights = sampling.WeightsBuffer()

    def prefill(self, requests: list[Request], device: torch.device) -> Batch | None:
        """The requests' prompts run as one batch; None when every request failed alone."""
        rows: list[Row] = []
        for request in requests:
            try:
                rows += new_rows(request)
            except Exception as error:  # this request's settings, not its neighbours'
                request.fail(error)
        if not rows:
            return None
        adapter = requests[0].adapter
        prompts: dict[Prompt, int] = {}
        source = [prompts.setdefault(tuple(row.request.prompt_ids), len(prompts)) for row in rows]
        distinct = list(prompts)
        # A greedy or seeded request must repeat itself, so its prompt is prefilled whole:
        # a prefix from the cache changes the rounding of the rest (attention split
        # differently), which can flip a near-tie.
        exact = {source[i] for i, row in enumerate(rows) if row.request.repeatable}
        chosen = [
            () if i in exact else prompt[: self.prefixes.prefix_of(prompt, distinct, adapter)]
            for i, prompt in enumerate(distinct)
        ]
        coarse = self.prefixes.coarsened(chosen)
        groups: dict[Prompt, list[int]] = {}
        for i, prefix in enumerate(chosen):
            groups.setdefault(coarse.get(prefix, prefix), []).append(i)
        # A prefix that only one prompt of this prefill starts with saves nothing now, so
        # it gets no model call of its own where it is not cached whole: its prompt runs
        # from the part that is cached (beside the other prompts that start with that),
        # and the prefix's keys and values are kept from that run, for later prompts.
        runs: dict[Prompt, list[tuple[int, Prompt]]] = {}  # run from -> (prompt, to keep)
        for prefix, members in groups.items():
            cached = len(prefix)
            if prefix and len(members) == 1:
                found = self.prefixes.longest(adapter, prefix)
                cached = found[0] if found is not None else 0
            if cached < len(prefix):
                runs.setdefault(prefix[:cached], []).append((members[0], prefix))
            else:
                runs.setdefault(prefix, []).extend((i, ()) for i in members)
        order: list[int] = []
        batch: Batch | None = None
        for start, run in runs.items():
            texts = [distinct[i] for i, _ in run]
            part = self._prefill_group(start, texts, adapter, device)
            self._keep_prefixes(part, start, texts, [keep for _, keep in run], adapter)
            batch = part if batch is None else stack(batch, part)
            order += [i for i, _ in run]
        for prompt in distinct:
            self.prefixes.remember(prompt)
        assert batch is not None
        place = {prompt_index: i for i, prompt_index in enumerate(order)}
        index = [place[i] for i in source]
        if index != list(range(len(batch.logits))):
            selected = torch.tensor(index, dtype=torch.long, device=device)
            batch.cache.batch_select_indices(selected)
            batch = replace(
                batch,
                attention=batch.attention[selected],
                next_position=batch.next_position[selected],
                logits=batch.logits[selected],
            )
        return replace(batch, rows=rows)

    def _prefill_group(
        self, prefix: Prompt, prompts: list[Prompt], adapter: str | None, device: torch.device
    ) -> Batch:
        """`prompts` (each starting with `prefix`, which may be empty) prefilled as one batch:
        cache rows laid out as [prefix | left padding | the rest of the prompt]."""
        if prefix:
            cache = kv_cache.with_prefix(self._prefix_kv(prefix, adapter, device), len(prompts))
            self.prefixes.saved += len(prefix) * (len(prompts) - 1)  # computed once for all
        else:
            cache = kv_cache.new_cache()
        rests = [prompt[len(prefix) :] for prompt in prompts]
        longest = max(len(rest) for rest in rests)
        input_ids = torch.full((len(rests), longest), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(rests), len(prefix) + longest), dtype=torch.long)
        attention[:, : len(prefix)] = 1
        for i, rest in enumerate(rests):
            input_ids[i, longest - len(rest) :] = torch.tensor(rest)
            attention[i, len(attention[i]) - len(rest) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, len(prefix) :]
        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention,
            "position_ids": positions,
            "past_key_values": cache,
            "use_cache": True,
        }
        lean = self._lean()
        if lean is not None:  # the last position's logits through the decode step's head
            hidden = self.model.get_decoder()(**inputs).last_hidden_state
            logits = lean.logits(hidden[:, -1, :])
        else:
            # An index tensor, not the int 1: the int slices a strided view of the hidden
            # states, and torch's matmul of such a view with a weight that does not require
            # grad (any PEFT-wrapped model) expands the whole LM head per row: 3x slower.
            output = self.model(**inputs, logits_to_keep=torch.tensor([longest - 1], device=device))
            logits = output.logits[:, -1, :].float()
        return Batch([], cache, attention, positions[:, -1:] + 1, logits)

    def _lean(self) -> LeanDecoder | None:
        """The lean decoder of the model the batch calls, where it reproduces that model."""
        lean = self.lean.lean if isinstance(self.lean, StaticDecoder) else self.lean
        return lean if lean is not None and self.model is lean.model else None

    def _keep_prefixes(
        self,
        part: Batch,
        prefix: Prompt,
        prompts: list[Prompt],
        keep: list[Prompt],
        adapter: str | None,
    ) -> None:
        """Cache `keep[i]` (a prefix of `prompts[i]`, or empty) from the prefill `part` of
        `prompts` from `prefix`, whose rows are laid out as [prefix | left padding | rest]."""
        longest = max(len(prompt) - len(prefix) for prompt in prompts)
        for row, (prompt, kept) in enumerate(zip(prompts, keep, strict=True)):
            if kept:
                padding = longest - (len(prompt) - len(prefix))
                layers = kv_cache.row_prefix(part.cache, row, len(kept), len(prefix), padding)
                self.prefixes.put(adapter, kept, layers)

    def _prefix_kv(
        self, prefix: Prompt, adapter: str | None, device: torch.device
    ) -> list[LayerKV]:
        """The keys and values of `prefix`: cached, or computed from its longest cached
        prefix on (a conversation's next turn extends the last) and cached."""
        found = self.prefixes.longest(adapter, prefix)
        start, layers = found if found is not None else (0, [])
        self.prefixes.saved += start
        if start == len(prefix):
            return layers
        cache = kv_cache.with_prefix(layers, 1) if layers else kv_cache.new_cache()
        inputs = {
            "input_ids": torch.tensor([prefix[start:]], device=device),
            "position_ids": torch.arange(start, len(prefix), device=device)[None],
            "past_key_values": cache,
            "use_cache": True,
        }
        if self._lean() is not None:  # only the keys and values are wanted: no LM head
            self.model.get_decoder()(**inputs)
        else:
            last = torch.tensor([len(prefix) - start - 1], device=device)
            self.model(**inputs, logits_to_keep=last)
        layers = kv_cache.row_prefix(cache, 0, len(prefix))
        self.prefixes.put(adapter, prefix, layers)
        return layers

    def step(self, batch: Batch) -> Batch:
        """Sample one token for every row, retire finished rows, and run the model once."""
        batch = keep(batch, [i for i, row in enumerate(batch.rows) if not row.request.ended])[0]
        if not batch.rows:
            return batch
        logits = batch.logits
        constrained = self.stepper.constrain(logits, batch.rows)
        # The logprobs returned for training are under the model's own temperature-1
        # distribution, unmasked: the one the trainer recomputes for the importance ratio.
        tokens, normalizers = sampling.sample_with_normalizers(
            constrained,
            [row.request.params.temperature for row in batch.rows],
            [row.request.params.top_p for row in batch.rows],
            [row.generator for row in batch.rows],
            unmasked=None if constrained is logits else logits,
            buffer=self.weights,
        )
        chosen = logits.gather(1, tokens[:, None]).squeeze(1) - normalizers
        # Everything the rows need from this step comes to the host in one transfer: on a
        # GPU each transfer waits for the device.
        parts = [tokens[:, None].double(), chosen[:, None].double()]
        top = max(row.request.params.top_logprobs for row in batch.rows)
        if top:
            values, ids = logits.topk(top, dim=-1)
            parts += [ids.double(), (values - normalizers[:, None]).double()]
        host = torch.cat(parts, dim=1).tolist()
        for i, row in enumerate(batch.rows):
            token, logprob = int(host[i][0]), host[i][1]
            wanted = row.request.params.top_logprobs
            ranked = [(int(host[i][2 + k]), host[i][2 + top + k]) for k in range(wanted)]
            try:
                self.stepper.advance(row, token, logprob, ranked)
            except Exception as error:  # this row's grammar or callback: it ends alone
                row.request.fail(error)
        kept = [i for i, row in enumerate(batch.rows) if not row.done and not row.request.ended]
        if len(kept) < len(batch.rows):
            batch, order = keep(batch, kept)
            tokens = tokens[_indices(order, tokens.device)]
        if not batch.rows:
            return batch
        attention = torch.cat([batch.attention, batch.attention.new_ones((len(kept), 1))], dim=1)
        if self.lean is not None and self.model is self.lean.model:
            logits = self.lean.step(tokens, batch.next_position, attention, batch.cache)
        else:
            output = self.model(
                input_ids=tokens[:, None],
                attention_mask=attention,
                position_ids=batch.next_position,
                past_key_values=batch.cache,
                use_cache=True,
            )
            logits = output.logits[:, -1, :].float()
        return Batch(batch.rows, batch.cache, attention, batch.next_position + 1, logits)


def join(running: Batch | None, new: Batch | None) -> Batch | None:
    """One batch of both (the new rows last); either may be missing or empty."""
    if new is None:
        return running
    if running is None or not running.rows:
        return new
    return stack(running, new)


def keep(batch: Batch, kept: list[int]) -> tuple[Batch, list[int]]:
    """The batch of rows `kept` only (their cache, mask, positions and logits), and the
    order they now have (`compacted`): row i of the result was row `order[i]`."""
    if len(kept) == len(batch.rows):
        return batch, kept
    order = compacted(kept)
    index = _indices(order, batch.logits.device)
    attention = batch.attention[index]
    if order:  # an emptied batch is dropped whole, cache included
        kv_cache.keep_rows(batch.cache, order)
        # Left padding no remaining row attends to is cut off the cache and the mask:
        # under a steady stream of requests the batch never drains, and without this
        # every step would attend over (and every join copy) all the padding so far.
        unused = int(attention.any(dim=0).to(torch.int8).argmax())
        if unused:
            kv_cache.trim_left(batch.cache, unused)
            attention = attention[:, unused:]
    kept_batch = Batch(
        [batch.rows[i] for i in order],
        batch.cache,
        attention,
        batch.next_position[index],
        batch.logits[index],
    )
    return kept_batch, order


def compacted(kept: list[int]) -> list[int]:
    """The rows `kept` (ascending) in an order that moves the fewest rows of the cache:
    a kept row among the first `len(kept)` stays where it is, and each place a leaving
    row frees there takes a kept row from below them. One row finishing in a batch of 32
    moves one row's keys and values, not 31 (a row's place in the batch means nothing)."""
    count = len(kept)
    staying = {i for i in kept if i < count}
    movers = iter(i for i in kept if i >= count)
    return [i if i in staying else next(movers) for i in range(count)]


def stack(top: Batch, bottom: Batch) -> Batch:
    """`top`'s rows then `bottom`'s: the shorter cache is left-padded (masked) to the longer."""
    length = max(top.attention.shape[1], bottom.attention.shape[1])
    kv_cache.join(top.cache, bottom.cache, length)
    attention = torch.cat(
        [_left_pad(top.attention, length, dim=1), _left_pad(bottom.attention, length, dim=1)]
    )
    return Batch(
        top.rows + bottom.rows,
        top.cache,
        attention,
        torch.cat([top.next_position, bottom.next_position]),
        torch.cat([top.logits, bottom.logits]),
    )


def _indices(index: list[int], device: torch.device) -> torch.Tensor:
    """`index` as a long tensor on `device`, copied without waiting for the device."""
    return torch.tensor(index, dtype=torch.long).to(device, non_blocking=True)


def _left_pad(tensor: torch.Tensor, length: int, dim: int = 2) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing == 0:
        return tensor
    # F.pad lists (left, right) pairs from the last dimension backwards.
    padding = [0, 0] * (tensor.dim() - 1 - dim) + [missing, 0]
    return F.pad(tensor, padding)


__all__ = ["Batch", "BatchDecoder", "compacted", "join", "keep", "stack"]
