"""The transformers inference engine: continuous batching with token ids and logprobs.

The decode loop runs as jobs on the process's torch thread (`torch_thread.py` says why
one thread), in turn with the model service's loading and training. It decodes every
running sequence one token per step with a shared KV cache (`batch.py`). Between steps
it admits waiting requests for the same adapter (their prompts are prefilled as a batch
and their cache rows joined to the running ones) and drops the rows that finished, so a
stream of agent turns keeps the batch full instead of waiting for its slowest member.
Requests for another adapter wait until the running batch drains; so do training
(`training()`, `paused()`, `exclusive()`) and any other job queued on the torch thread.

A decode loop of our own rather than `model.generate`, because each row needs its own
sampling settings, seed, stop strings and streaming callback, rows join and leave
mid-flight, and training needs the sampled ids with their logprobs under the model's
own (temperature-1) distribution.

Each row fails alone (`rows.py`). A request whose caller went away (its future
cancelled), whose streaming callback raises, or whose settings cannot be used (a seed
torch refuses) is ended and its rows leave the batch at the next step, freeing their
slots; the other rows go on. A request whose adapter is not loaded (never, or no longer)
fails with `AdapterGone` before it is admitted, with every other request waiting for
that adapter. Only an error of the model call itself, which every row shares, fails
the batch.

The engine owns its model lock and the choice of the active adapter. Lock order: the
model lock is taken by a decode job (never blocking: a job that finds it held ends, and
the pause's end queues the next) or by `paused()`; nothing else is taken while holding
it except the torch thread's queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch

from ... import models
from ...torch_thread import TorchThread, shared
from ...trainer.memory import return_free_heap
from ..base import AdapterGone, EngineSpec, OnToken, Sample, SamplingParams
from ..structured import Grammars
from .batch import Batch, BatchDecoder, join
from .decode_graphs import StaticDecoder
from .kv_cache import cache_bytes
from .lean_decode import LeanDecoder, packs
from .merged import MergedCopy, mergeable, plain_model, share_unmerged
from .packed import pack, packed_bytes
from .prefix_cache import PrefixCache
from .rows import Request, RowStepper

_MAX_WAIT_STEPS = 8
# On a GPU a prefill call costs tens of milliseconds of host time whatever its length
# (~60 ms for a 1B model through transformers' module stack on an H200's host, launch-
# bound), the time of prefilling hundreds of tokens a row there: only a prefix that long is
# worth a call (and a cache entry) of its own. A batch of 64 prompts seen before had each
# taken its own prefix at the CPU's 16 and ran 64 prefill calls (#49).
_GPU_PREFIX_MIN_TOKENS = 256
T = TypeVar("T")


class TransformersEngine:
    """Serves one transformers model (and its PEFT adapters) to concurrent requests.

    `serves_training_weights`: `model` is the trainer's own model (shared mode), so an
    adapter being trained is served live and a training step pauses decoding
    (`training()`); False: `model` is this engine's own copy, which serves checkpoints
    loaded by name and keeps serving while a step trains elsewhere. Batches run on
    `torch_thread` (default: the process's, `torch_thread.shared()`).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_num_seqs: int,
        stop_token_ids: set[int],
        batch_window_s: float = 0.01,
        merged: MergedCopy | None = None,
        serves_training_weights: bool = True,
        torch_thread: TorchThread | None = None,
    ) -> None:
        self.model = model
        self.merged = merged  # a plain copy to sample from, the served adapter merged in
        self.tokenizer = tokenizer
        self.max_num_seqs = max_num_seqs
        self.stop_token_ids = stop_token_ids
        self.batch_window_s = batch_window_s
        self.grammars = Grammars(tokenizer, stop_token_ids)
        self.serves_training_weights = serves_training_weights
        self.serves_while_training = not serves_training_weights
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        on_gpu = next(model.parameters()).device.type != "cpu"
        self._prefixes = PrefixCache(min_tokens=_GPU_PREFIX_MIN_TOKENS if on_gpu else 16)
        self._decoder = BatchDecoder(
            RowStepper(tokenizer, stop_token_ids, self.grammars),
            pad_id,
            self._prefixes,
            _lean_decoder(merged),
        )
        self._model_lock = threading.Lock()  # held while a batch runs, and by `paused()`
        self._queue: queue.Queue[Request] = queue.Queue()
        self._held: list[Request] = []  # taken from the queue, not yet admitted
        self._pausing = threading.Event()
        self._paused_by: int | None = None  # the thread holding the pause
        self._closed = False
        self.thread = torch_thread or shared()
        self._schedule_lock = threading.Lock()
        self._scheduled = False  # a decode job is queued or running
        self._wanted = False  # something happened that the running job may not have seen
        self._waited_steps = 0  # decode steps the oldest waiting request has waited
        self._active_rows = 0
        self._batch_cache: Any = None  # the running batch's cache, as of the last decode step

    @property
    def samples_merged(self) -> bool:
        return self.merged is not None

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
        self._queue.put(Request(prompt_ids, params, n, adapter, on_token, future))
        self._schedule()
        try:
            return await asyncio.wrap_future(future)
        finally:
            future.cancel()  # a no-op once answered; otherwise the worker drops the rows

    @property
    def active_rows(self) -> int:
        """Rows (sequences) in the running batch, as of the last decode step."""
        return self._active_rows

    @property
    def decode_graphs_captured(self) -> int:
        """CUDA graphs captured for decode steps so far (0 where steps run without)."""
        lean = self._decoder.lean
        return lean.captured if isinstance(lean, StaticDecoder) else 0

    @property
    def kv_cache_bytes(self) -> int:
        """The running batch's cache, as of the last decode step (summed when asked:
        never on the decode path)."""
        cache = self._batch_cache
        return 0 if cache is None else cache_bytes(cache)

    @property
    def prefix_cache_bytes(self) -> int:
        return self._prefixes.bytes

    def training(self) -> contextlib.AbstractContextManager[None]:
        """A pause where this engine decodes from the trainer's model; else nothing."""
        return self.paused() if self.serves_training_weights else contextlib.nullcontext()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the model exclusively: running rows finish, new requests wait.

        From a thread other than the torch thread, the model's torch work then runs on
        that thread; `exclusive()` runs it on the torch thread instead.
        """
        self._pausing.set()
        try:
            with self._model_lock:
                self._pausing.clear()
                self._paused_by = threading.get_ident()
                if isinstance(self._decoder.lean, LeanDecoder):
                    self._decoder.lean.release()  # its memory to training, meanwhile
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
        """Load a saved PEFT adapter beside the others, as `name`; the first one turns a
        plain model into a PEFT model."""
        self.exclusive(lambda: self._load_adapter(name, directory))

    def _load_adapter(self, name: str, directory: Path) -> None:
        from peft import PeftModel

        # A PEFT model whose adapters were all unloaded stays one: it takes the next.
        if isinstance(self.model, PeftModel):
            self.model.load_adapter(str(directory), adapter_name=name)
            return
        self.model = PeftModel.from_pretrained(self.model, str(directory), adapter_name=name)
        self.model.eval()
        if self.merged is not None:
            self.merged.peft_model = self.model

    def unload_adapter(self, name: str) -> None:
        """Its running rows finish first; requests still waiting for it fail (`AdapterGone`)."""
        self.exclusive(lambda: self.model.delete_adapter(name))
        self._schedule()  # the waiting ones are answered by the next decode job

    def memory_bytes(self) -> int:
        """The weights of this engine's own copies: its model unless it is the trainer's,
        and the merged copy."""
        total = 0 if self.serves_training_weights else _bytes(self.model)
        if isinstance(self._decoder.lean, LeanDecoder):
            total += self._decoder.lean.held_bytes
        return total + (_bytes(self.merged.plain) if self.merged is not None else 0)

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

    def _runs(self) -> Any:
        """The module a batch calls: the PEFT model, or the plain model beneath it where
        no adapter is loaded (a PEFT model without adapters cannot run a forward pass)."""
        return self.model if _adapters(self.model) else plain_model(self.model)

    def _select(self, adapter: str | None) -> contextlib.AbstractContextManager[None]:
        """Make `adapter` (None: the base model) the active weights for a batch."""
        if adapter is None:
            if _adapters(self.model):
                return self.model.disable_adapter()  # type: ignore[no-any-return]
            return contextlib.nullcontext()
        self.model.set_adapter(adapter)
        return contextlib.nullcontext()

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
        blocked = ran = False
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
                if self._pausing.is_set() or not self._model_lock.acquire(blocking=False):
                    blocked = True
                    break
                try:
                    ran = True
                    self._run_batch()
                finally:
                    self._model_lock.release()
        finally:
            with self._schedule_lock:
                self._scheduled = False
                again = self._wanted or (not blocked and bool(self._held))
            if again:
                self._schedule()
            elif ran and self._queue.empty():
                # Idle: the batches' caches, freed, go back to the system. Under glibc's
                # mmap threshold they came from the heap, which keeps its high-water mark.
                return_free_heap()

    def _run_batch(self) -> None:
        """Decode the first held request's adapter until its rows are done and no more
        of its requests are admitted."""
        adapter = self._held[0].adapter
        if adapter is not None and adapter not in _adapters(self.model):
            self._fail_waiting(adapter, AdapterGone(adapter))
            return
        admitted: list[Request] = []
        try:
            with self._select(adapter), torch.inference_mode():
                self._decoder.model = (
                    self.merged.model_for(adapter) if self.merged is not None else self._runs()
                )
                device = next(self.model.parameters()).device
                batch: Batch | None = None
                while True:
                    new = self._admit(adapter, running=len(batch.rows) if batch else 0)
                    admitted += new
                    if new:
                        batch = join(batch, self._decoder.prefill(new, device))
                    if batch is None or not batch.rows:
                        break
                    batch = self._decoder.step(batch)
                    self._active_rows = len(batch.rows)
                    self._batch_cache = batch.cache
        except BaseException as error:  # delivered to the waiting callers, never lost
            if not admitted:  # selecting the adapter failed: never retry it forever
                self._fail_waiting(adapter, error)
            for request in admitted:
                request.fail(error)
        finally:
            self._active_rows, self._batch_cache = 0, None
            self._decoder.weights.release()

    def _fail_waiting(self, adapter: str | None, error: BaseException) -> None:
        """Fail every held request for `adapter`: none of them can run."""
        for request in [r for r in self._held if r.adapter == adapter]:
            request.fail(error)
            self._held.remove(request)

    def _take_queued(self, wait_s: float | None) -> None:
        """Move queued requests to the held list, each waited for up to `wait_s` (None: no wait)."""
        while True:
            try:
                request = self._queue.get(timeout=wait_s) if wait_s else self._queue.get_nowait()
            except queue.Empty:
                return
            self._held.append(request)

    def _admit(self, adapter: str | None, running: int) -> list[Request]:
        self._take_queued(wait_s=None)
        if self._pausing.is_set() or self._closed or self.thread.others_waiting:
            return []
        if running and any(request.adapter != adapter for request in self._held):
            return []  # drain, then serve the other adapter's requests
        if running and not self._worth_a_prefill(adapter, running):
            return []
        self._waited_steps = 0
        admitted: list[Request] = []
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


def start_transformers_engine(
    spec: EngineSpec, training_model: Any | None, thread: TorchThread | None = None
) -> TransformersEngine:
    """The engine for `spec`, built on the torch thread where it will decode.

    It decodes from `training_model` (the trainer's PEFT model in this process) in shared
    mode; in dedicated mode (`trainer_gpu_ids` set), or with no trainer here (a Ray
    replica), from its own copy of the weights, which serves checkpoints by name.
    """
    thread = thread or shared()
    config = spec.config
    own_copy = training_model is None or config.trainer_gpu_ids is not None

    def build() -> TransformersEngine:
        model: Any = training_model
        if own_copy:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model, _ = models.load(spec.resolved, config.init_args.dtype, device)
        return TransformersEngine(
            model,
            spec.tokenizer,
            max_num_seqs=config.engine_args.max_num_seqs,
            stop_token_ids=set(spec.stop_token_ids),
            merged=_merged_copy(model, spec),
            serves_training_weights=not own_copy,
            torch_thread=thread,
        )

    return thread.run(build)


def _merged_copy(served: Any, spec: EngineSpec) -> MergedCopy | None:
    """A plain copy to sample `served`'s adapters from (`merge_lora(config)`), or None."""
    from ...trainer.memory import budget
    from .config import merge_lora

    config = spec.config
    device = next(served.parameters()).device
    wanted = merge_lora(config)
    if wanted is None:
        size = _bytes(served)
        free = budget(device, None).available
        wanted = mergeable(config.peft_args.target_modules) and size < free // 4
    if not wanted:
        return None
    plain, _ = models.load(spec.resolved, config.init_args.dtype, str(device))
    plain.requires_grad_(False)
    share_unmerged(plain, plain_model(served))
    packing = packs(plain)
    if packing is not None:
        pack(plain, packing)
    if device.type == "cpu":
        # The plain weights `pack` replaced, and the load's temporaries, are free but still
        # resident in the torch thread's glibc arena: the default model's packed copy held
        # 0.4-0.6 GB more after `register` without this (benchmarks/RESULTS.md).
        return_free_heap()
    return MergedCopy(served, plain)


def _lean_decoder(merged: MergedCopy | None) -> LeanDecoder | StaticDecoder | None:
    """Decode steps of the plain copy without transformers' module stack where its
    architecture allows; on a GPU replayed from CUDA graphs (`decode_graphs.py`)."""
    lean = LeanDecoder.of(merged.plain) if merged is not None else None
    if lean is not None and lean.model.device.type == "cuda":
        return StaticDecoder(lean, graphs=True)
    return lean


def _adapters(model: Any) -> dict[str, Any]:
    """The PEFT adapters `model` holds by name (none for a plain model)."""
    return getattr(model, "peft_config", None) or {}


def _bytes(model: Any) -> int:
    plain = sum(int(p.numel() * p.element_size()) for p in model.parameters())
    return plain + packed_bytes(model)


__all__ = ["TransformersEngine", "start_transformers_engine"]
