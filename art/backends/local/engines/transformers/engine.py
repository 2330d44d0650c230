"""The transformers inference engine: continuous batching with token ids and logprobs.

The decode loop runs as jobs on the process's torch thread (`torch_thread.py` says why
one thread), in turn with the model service's loading and training. It decodes every
running sequence one token per step with a shared KV cache. Between steps it admits
waiting requests for the same adapter (their prompts are prefilled as a batch and their
cache rows joined to the running ones) and drops the rows that finished, so a stream of
agent turns keeps the batch full instead of waiting for its slowest member. Requests
for another adapter wait until the running batch drains; so do training (`paused()`,
`exclusive()`) and any other job queued on the torch thread.

A decode loop of our own rather than `model.generate`, because each row needs its own
sampling settings, seed, stop strings and streaming callback, rows join and leave
mid-flight, and training needs the sampled ids with their logprobs under the model's
own (temperature-1) distribution.

Each row fails alone. A request whose caller went away (its future cancelled), whose
streaming callback raises, or whose settings cannot be used (a seed torch refuses) is
ended and its rows leave the batch at the next step, freeing their slots; the other rows
go on. Only an error of the model call itself, which every row shares, fails the batch.

A request may carry a grammar (`SamplingParams.grammar`, see `structured.py`): its rows
sample only the tokens the grammar allows. Masks are computed for those rows alone, and
a step with no constrained row does no grammar work at all.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from ...torch_thread import TorchThread, shared
from ..base import OnToken, Sample, SamplingParams, text_until_stop
from ..structured import Grammars
from . import kv_cache, sampling
from .lean_decode import LeanDecoder
from .merged import MergedCopy
from .prefix_cache import LayerKV, PrefixCache, Prompt

_MAX_WAIT_STEPS = 8
T = TypeVar("T")


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    n: int
    adapter: str | None
    on_token: OnToken | None
    future: concurrent.futures.Future[list[Sample]]
    samples: list[Sample] = field(default_factory=list)
    unfinished: int = 0

    @property
    def ended(self) -> bool:
        """Answered, failed, or abandoned by its caller (a cancelled future)."""
        return self.future.done()

    def fail(self, error: BaseException) -> None:
        _settle(self.future, error=error)


@dataclass
class _Row:
    request: _Request
    index: int
    sample: Sample
    generator: torch.Generator | None
    matcher: Any = None  # llguidance.LLMatcher of the request's grammar, if it has one
    done: bool = False


@dataclass
class _Batch:
    """The running rows and their decoding state, row i of every tensor being rows[i]."""

    rows: list[_Row]
    cache: Any  # a transformers Cache of kv_cache.GrowingLayer
    attention: torch.Tensor  # (rows, cached length)
    next_position: torch.Tensor  # (rows, 1)
    logits: torch.Tensor  # (rows, vocab): the distribution of each row's next token


class TransformersEngine:
    """Serves one transformers model (and its PEFT adapters) to concurrent requests.

    `model_lock` is held while a batch runs; whoever else changes the model (training,
    loading adapters) runs it through `exclusive()`, on the torch thread, or takes it
    through `paused()` from another thread. `select_adapter(name)` makes `name` (None: the
    base model) the active weights for the duration of a batch. Batches run on
    `torch_thread` (default: the process's, `torch_thread.shared()`).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_num_seqs: int,
        model_lock: threading.Lock,
        select_adapter: Callable[[str | None], contextlib.AbstractContextManager[None]],
        stop_token_ids: set[int],
        batch_window_s: float = 0.01,
        merged: MergedCopy | None = None,
        serves_training_weights: bool = True,
        torch_thread: TorchThread | None = None,
    ) -> None:
        self.model = model
        self.merged = merged  # a plain copy to sample from, the served adapter merged in
        self._running_model: Any = model  # what the running batch calls
        # Decode steps of the plain copy skip transformers' module stack where it can.
        self._lean = LeanDecoder.of(merged.plain) if merged is not None else None
        self._prefixes = PrefixCache()
        self.tokenizer = tokenizer
        self.max_num_seqs = max_num_seqs
        self.model_lock = model_lock
        self.select_adapter = select_adapter
        self.stop_token_ids = stop_token_ids
        self.batch_window_s = batch_window_s
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._held: list[_Request] = []  # taken from the queue, not yet admitted
        self._pausing = threading.Event()
        self._paused_by: int | None = None  # the thread holding the pause
        self._closed = False
        self.thread = torch_thread or shared()
        self._schedule_lock = threading.Lock()
        self._scheduled = False  # a decode job is queued or running
        self._wanted = False  # something happened that the running job may not have seen
        self._waited_steps = 0  # decode steps the oldest waiting request has waited
        self._active_rows = 0
        self.grammars = Grammars(tokenizer, stop_token_ids)
        # False in dedicated mode: `model` is a serving copy that holds checkpoints loaded by
        # `load_adapter`, while the trainer updates its own copy.
        self.serves_training_weights = serves_training_weights

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        n: int = 1,
        adapter: str | None = None,
        on_token: OnToken | None = None,
    ) -> list[Sample]:
        """Sample `n` sequences for one prompt.

        Cancelling the awaiting task abandons the request: its rows stop decoding at the
        next step.
        """
        if self._closed:
            raise RuntimeError("the inference engine was closed")
        future: concurrent.futures.Future[list[Sample]] = concurrent.futures.Future()
        self._queue.put(_Request(prompt_ids, params, n, adapter, on_token, future))
        self._schedule()
        try:
            return await asyncio.wrap_future(future)
        finally:
            future.cancel()  # a no-op once answered; otherwise the worker drops the rows

    @property
    def active_rows(self) -> int:
        """Rows (sequences) in the running batch, as of the last decode step."""
        return self._active_rows

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the model exclusively: running rows finish, new requests wait.

        From a thread other than the torch thread, the model's torch work then runs on
        that thread; `exclusive()` runs it on the torch thread instead.
        """
        self._pausing.set()
        try:
            with self.model_lock:
                self._pausing.clear()
                self._paused_by = threading.get_ident()
                try:
                    yield
                finally:  # whoever paused may have changed the weights
                    self._paused_by = None
                    self._prefixes.clear()
                    if self.merged is not None:
                        self.merged.invalidate()
        finally:
            self._pausing.clear()
            self._schedule()  # requests that waited for the pause

    def exclusive(self, work: Callable[[], T]) -> T:
        """`work()` with sole use of the model (see `paused`), on the torch thread; on
        the caller's thread if it holds the pause already."""
        if self._paused_by == threading.get_ident():
            return work()

        def paused_work() -> T:
            with self.paused():
                return work()

        return self.thread.run(paused_work)

    def load_adapter(self, name: str, directory: Path) -> None:
        """Load a saved PEFT adapter beside the others, as `name`."""
        self.exclusive(lambda: self.model.load_adapter(str(directory), adapter_name=name))

    def unload_adapter(self, name: str) -> None:
        self.exclusive(lambda: self.model.delete_adapter(name))  # its rows finish first

    def close(self) -> None:
        """Finish the running rows; fail the requests that wait."""
        self._closed = True
        if not self.thread.is_current():
            with contextlib.suppress(concurrent.futures.TimeoutError):
                self.thread.submit(lambda: None).result(timeout=30)  # after our running job
        self._take_queued(wait_s=None)
        for request in self._held:
            request.fail(RuntimeError("the inference engine was closed"))
        self._held.clear()

    # --- the decode jobs ----------------------------------------------------------------

    def _schedule(self) -> None:
        """Queue a decode job on the torch thread unless one is queued or running."""
        with self._schedule_lock:
            self._wanted = True
            if self._scheduled or self._closed:
                return
            self._scheduled = True
        self.thread.submit(self._serve)

    def _serve(self) -> None:
        """A decode job: batches run while requests wait, until another job waits.

        A pause held from another thread ends the job; the pause's end queues the next.
        """
        with self._schedule_lock:
            self._wanted = False
        blocked = False
        try:
            if self._closed:
                return
            before = len(self._held)
            self._take_queued(wait_s=None)
            if len(self._held) > before:
                # Keep taking requests while they keep coming, so requests sent together
                # (a gather of rollouts) are prefilled together.
                self._take_queued(wait_s=self.batch_window_s)
            while self._held and not self._closed and not self.thread.others_waiting:
                if self._pausing.is_set() or not self.model_lock.acquire(blocking=False):
                    blocked = True
                    break
                try:
                    self._run_batch()
                finally:
                    self.model_lock.release()
        finally:
            with self._schedule_lock:
                self._scheduled = False
                again = self._wanted or (not blocked and bool(self._held))
            if again:
                self._schedule()

    def _run_batch(self) -> None:
        """Decode the first held request's adapter until its rows are done and no more
        of its requests are admitted."""
        adapter = self._held[0].adapter
        admitted: list[_Request] = []
        try:
            with self.select_adapter(adapter), torch.inference_mode():
                self._running_model = (
                    self.merged.model_for(adapter) if self.merged is not None else self.model
                )
                batch: _Batch | None = None
                while True:
                    new = self._admit(adapter, running=len(batch.rows) if batch else 0)
                    admitted += new
                    if new:
                        batch = self._join(batch, self._prefill(new))
                    if batch is None or not batch.rows:
                        break
                    batch = self._step(batch)
                    self._active_rows = len(batch.rows)
        except BaseException as error:  # delivered to the waiting callers, never lost
            for request in admitted:
                request.fail(error)
        finally:
            self._active_rows = 0

    def _take_queued(self, wait_s: float | None) -> None:
        """Move queued requests to the held list, each waited for up to `wait_s` (None: no wait)."""
        while True:
            try:
                request = self._queue.get(timeout=wait_s) if wait_s else self._queue.get_nowait()
            except queue.Empty:
                return
            self._held.append(request)

    def _admit(self, adapter: str | None, running: int) -> list[_Request]:
        self._take_queued(wait_s=None)
        if self._pausing.is_set() or self._closed or self.thread.others_waiting:
            return []
        if running and any(request.adapter != adapter for request in self._held):
            return []  # drain, then serve the other adapter's requests
        if running and not self._worth_a_prefill(adapter, running):
            return []
        self._waited_steps = 0
        admitted: list[_Request] = []
        size = running
        for request in list(self._held):
            if request.ended:  # abandoned while waiting
                self._held.remove(request)
                continue
            if request.adapter != adapter:
                continue
            if size + request.n > self.max_num_seqs and (admitted or running):
                break
            admitted.append(request)
            self._held.remove(request)
            size += request.n
        return admitted

    def _worth_a_prefill(self, adapter: str | None, running: int) -> bool:
        """Whether to pause the running rows for a prefill of the waiting requests now.

        Every prefill costs the running rows a model call's fixed overhead, so waiting
        requests are gathered until there are an eighth of `max_num_seqs` of them, the
        batch runs low, or they have waited `_MAX_WAIT_STEPS` decode steps. (Admitting as
        soon as one slot frees, under a steady stream of agent turns, prefills one
        request per decode step and nearly halves throughput.)
        """
        waiting = sum(request.n for request in self._held if request.adapter == adapter)
        if not waiting:
            return False
        self._waited_steps += 1
        return (
            waiting >= max(1, self.max_num_seqs // 8)
            or running < self.max_num_seqs // 4
            or self._waited_steps > _MAX_WAIT_STEPS
        )

    def _prefill(self, requests: list[_Request]) -> _Batch | None:
        """The requests' prompts run as one batch; None when every request failed alone."""
        rows: list[_Row] = []
        for request in requests:
            try:
                rows += self._rows(request)
            except Exception as error:  # this request's settings, not its neighbours'
                request.fail(error)
        if not rows:
            return None
        device = next(self.model.parameters()).device
        adapter = requests[0].adapter
        # Rows with the same prompt (a request's n samples, a group's rollouts sent
        # together) share one prefilled row, copied to each of them; prompts that start
        # with a shared prefix take its keys and values from the prefix cache.
        prompts: dict[Prompt, int] = {}
        source = [prompts.setdefault(tuple(row.request.prompt_ids), len(prompts)) for row in rows]
        distinct = list(prompts)
        # A greedy or seeded request must repeat itself, so its prompt is prefilled whole:
        # a prefix from the cache changes the rounding of the rest (attention split
        # differently), which can flip a near-tie.
        exact = {source[i] for i, row in enumerate(rows) if _repeatable(row.request.params)}
        chosen = [
            () if i in exact else prompt[: self._prefixes.prefix_of(prompt, distinct, adapter)]
            for i, prompt in enumerate(distinct)
        ]
        coarse = self._prefixes.coarsened(chosen)
        groups: dict[Prompt, list[int]] = {}
        for i, prefix in enumerate(chosen):
            groups.setdefault(coarse.get(prefix, prefix), []).append(i)
        order: list[int] = []
        batch: _Batch | None = None
        for prefix, members in groups.items():
            part = self._prefill_group(prefix, [distinct[i] for i in members], adapter, device)
            batch = part if batch is None else _stack(batch, part)
            order += members
        for prompt in distinct:
            self._prefixes.remember(prompt)
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
    ) -> _Batch:
        """`prompts` (each starting with `prefix`, which may be empty) prefilled as one batch:
        cache rows laid out as [prefix | left padding | the rest of the prompt]."""
        if prefix:
            cache = kv_cache.with_prefix(self._prefix_kv(prefix, adapter, device), len(prompts))
            self._prefixes.saved += len(prefix) * (len(prompts) - 1)  # computed once for all
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
        output = self._running_model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            # An index tensor, not the int 1: the int slices a strided view of the hidden
            # states, and torch's matmul of such a view with a weight that does not require
            # grad (any PEFT-wrapped model) expands the whole LM head per row: 3x slower.
            logits_to_keep=torch.tensor([longest - 1], device=device),
        )
        logits = output.logits[:, -1, :].float()
        return _Batch([], cache, attention, positions[:, -1:] + 1, logits)

    def _prefix_kv(
        self, prefix: Prompt, adapter: str | None, device: torch.device
    ) -> list[LayerKV]:
        """The keys and values of `prefix`: cached, or computed from its longest cached
        prefix on (a conversation's next turn extends the last) and cached."""
        found = self._prefixes.longest(adapter, prefix)
        start, layers = found if found is not None else (0, [])
        self._prefixes.saved += start
        if start == len(prefix):
            return layers
        cache = kv_cache.with_prefix(layers, 1) if layers else kv_cache.new_cache()
        self._running_model(
            input_ids=torch.tensor([prefix[start:]], device=device),
            position_ids=torch.arange(start, len(prefix), device=device)[None],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=torch.tensor([len(prefix) - start - 1], device=device),
        )
        layers = kv_cache.row_prefix(cache, 0, len(prefix))
        self._prefixes.put(adapter, prefix, layers)
        return layers

    def _rows(self, request: _Request) -> list[_Row]:
        request.samples = [Sample() for _ in range(request.n)]
        request.unfinished = request.n
        rows = []
        for index, sample in enumerate(request.samples):
            generator = None
            if request.params.seed is not None:
                generator = torch.Generator().manual_seed(request.params.seed + index)
            grammar = request.params.grammar
            matcher = grammar.matcher() if grammar is not None else None
            rows.append(_Row(request, index, sample, generator, matcher))
        return rows

    def _join(self, running: _Batch | None, new: _Batch | None) -> _Batch | None:
        """One batch of both (the new rows last); either may be missing or empty."""
        if new is None:
            return running
        if running is None or not running.rows:
            return new
        return _stack(running, new)

    def _step(self, batch: _Batch) -> _Batch:
        """Sample one token for every row, retire finished rows, and run the model once."""
        batch = self._keep(batch, [i for i, row in enumerate(batch.rows) if not row.request.ended])
        if not batch.rows:
            return batch
        logits = batch.logits
        constrained = [i for i, row in enumerate(batch.rows) if row.matcher is not None]
        tokens = sampling.sample(
            self._constrain(logits, batch.rows, constrained),
            [row.request.params.temperature for row in batch.rows],
            [row.request.params.top_p for row in batch.rows],
            [row.generator for row in batch.rows],
        )
        # The logprobs returned for training are under the model's own temperature-1
        # distribution, unmasked: the one the trainer recomputes for the importance ratio.
        normalizers = sampling.normalizers(logits)
        chosen = (logits.gather(1, tokens[:, None]).squeeze(1) - normalizers).tolist()
        token_list = tokens.tolist()
        for i, row in enumerate(batch.rows):
            try:
                self._advance(row, token_list[i], chosen[i], logits[i], normalizers[i])
            except Exception as error:  # this row's grammar or callback: it ends alone
                row.request.fail(error)
        keep = [i for i, row in enumerate(batch.rows) if not row.done and not row.request.ended]
        if len(keep) < len(batch.rows):
            tokens = tokens[torch.tensor(keep, dtype=torch.long, device=tokens.device)]
            batch = self._keep(batch, keep)
        if not batch.rows:
            return batch
        attention = torch.cat([batch.attention, batch.attention.new_ones((len(keep), 1))], dim=1)
        if self._lean is not None and self._running_model is self._lean.model:
            logits = self._lean.step(tokens, batch.next_position, attention, batch.cache)
        else:
            output = self._running_model(
                input_ids=tokens[:, None],
                attention_mask=attention,
                position_ids=batch.next_position,
                past_key_values=batch.cache,
                use_cache=True,
            )
            logits = output.logits[:, -1, :].float()
        return _Batch(batch.rows, batch.cache, attention, batch.next_position + 1, logits)

    def _advance(
        self, row: _Row, token: int, logprob: float, logits: torch.Tensor, normalizer: torch.Tensor
    ) -> None:
        """Give `row` its sampled token; answer its request once all its rows are done."""
        if row.matcher is not None and not row.matcher.consume_token(token):
            raise RuntimeError(f"the grammar rejected its own token: {row.matcher.get_error()}")
        self._append(row, token, logprob, logits, normalizer)
        if row.request.on_token is not None:
            row.request.on_token(row.index, token)
        if row.done:
            row.request.unfinished -= 1
            if row.request.unfinished == 0:
                _settle(row.request.future, result=row.request.samples)

    def _keep(self, batch: _Batch, keep: list[int]) -> _Batch:
        """The batch of rows `keep` only (their cache, mask, positions and logits)."""
        if len(keep) == len(batch.rows):
            return batch
        index = torch.tensor(keep, dtype=torch.long, device=batch.logits.device)
        attention = batch.attention[index]
        if keep:  # an emptied batch is dropped whole, cache included
            batch.cache.batch_select_indices(index)
            # Left padding no remaining row attends to is cut off the cache and the mask:
            # under a steady stream of requests the batch never drains, and without this
            # every step would attend over (and every join copy) all the padding so far.
            unused = int(attention.any(dim=0).to(torch.int8).argmax())
            if unused:
                kv_cache.trim_left(batch.cache, unused)
                attention = attention[:, unused:]
        return _Batch(
            [batch.rows[i] for i in keep],
            batch.cache,
            attention,
            batch.next_position[index],
            batch.logits[index],
        )

    def _constrain(
        self, logits: torch.Tensor, rows: list[_Row], constrained: list[int]
    ) -> torch.Tensor:
        """The logits to sample from: the constrained rows' disallowed tokens at -inf."""
        if not constrained:
            return logits
        matchers = [rows[i].matcher for i in constrained]
        allowed = self.grammars.allowed_tokens(matchers, logits.shape[1]).to(logits.device)
        index = torch.tensor(constrained, device=logits.device)
        masked = logits.clone()
        masked[index] = logits[index].masked_fill(~allowed, float("-inf"))
        return masked

    def _append(
        self, row: _Row, token: int, logprob: float, logits: torch.Tensor, normalizer: torch.Tensor
    ) -> None:
        params, sample = row.request.params, row.sample
        sample.token_ids.append(token)
        sample.logprobs.append(logprob)
        if params.top_logprobs:
            values, ids = logits.topk(params.top_logprobs)
            values = values - normalizer
            sample.top_logprobs.append(list(zip(ids.tolist(), values.tolist(), strict=True)))
        if token in self.stop_token_ids:
            sample.finish_reason, row.done = "stop", True
        elif params.stop:
            text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
            until_stop = text_until_stop(text, params.stop)
            if until_stop is not None:
                sample.text = until_stop
                sample.finish_reason, row.done = "stop", True
                return
        if not row.done and len(sample.token_ids) >= params.max_tokens:
            sample.finish_reason, row.done = "length", True
        if row.done:
            sample.text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)


def _repeatable(params: SamplingParams) -> bool:
    """Whether a request's answer must be the same every time: greedy or seeded."""
    return params.seed is not None or params.temperature == 0


def _settle(
    future: concurrent.futures.Future[list[Sample]],
    *,
    result: list[Sample] | None = None,
    error: BaseException | None = None,
) -> None:
    """Answer `future` unless it is already done; a caller may cancel at any moment."""
    try:
        if error is not None:
            future.set_exception(error)
        elif result is not None:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass  # cancelled (its caller went away) or already failed: nobody is waiting


def _stack(top: _Batch, bottom: _Batch) -> _Batch:
    """`top`'s rows then `bottom`'s: the shorter cache is left-padded (masked) to the longer."""
    length = max(top.attention.shape[1], bottom.attention.shape[1])
    kv_cache.join(top.cache, bottom.cache, length)
    attention = torch.cat(
        [_left_pad(top.attention, length, dim=1), _left_pad(bottom.attention, length, dim=1)]
    )
    return _Batch(
        top.rows + bottom.rows,
        top.cache,
        attention,
        torch.cat([top.next_position, bottom.next_position]),
        torch.cat([top.logits, bottom.logits]),
    )


def _left_pad(tensor: torch.Tensor, length: int, dim: int = 2) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing == 0:
        return tensor
    # F.pad lists (left, right) pairs from the last dimension backwards.
    padding = [0, 0] * (tensor.dim() - 1 - dim) + [missing, 0]
    return F.pad(tensor, padding)
