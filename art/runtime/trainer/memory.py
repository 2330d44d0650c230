"""Memory of a training step: what it will take, what the machine has, what it took.

The trainer plans each step before running it: `StepMemory` estimates the bytes a
micro-batch of N tokens keeps alive (activations saved for backward, with or without
gradient checkpointing, and the fixed workspace of the chunked LM head and the
optimizer), `budget_bytes` says how much the process may use, and `PeakMemory` measures
what the step really took: peak RSS on CPU (Linux's VmHWM), peak allocated device memory
on CUDA. Both counters, and glibc's mmap threshold a CPU step lowers, are the process's:
`ProcessMemory` owns them for every step in progress at once.

The per-token figures count the tensors a decoder layer of the Llama family saves for
backward (its norms, q/k/v, attention output, the MLP's gate/up/activation products),
so they follow the model's shape and dtype; tests/runtime/test_train_memory.py checks the
estimate against the measured peak on the default model.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

GIB = 1024**3
# Estimates are of the tensors torch keeps; allocator slack and temporaries add to them.
_SAFETY = 1.3
# Headroom left to the rest of the machine when no budget is configured.
_AVAILABLE_SHARE = 0.9
# LM-head logits computed at once: this many bytes of float32 [rows x vocabulary].
LOGITS_CHUNK_BYTES = 64 * 1024**2


@dataclass(frozen=True)
class StepMemory:
    """Bytes a training micro-batch keeps alive, from the model's shape and dtype."""

    layers: int
    hidden: int
    intermediate: int
    q_dim: int  # attention heads x head dim
    kv_dim: int  # key/value heads x head dim
    vocab: int
    dtype_bytes: int
    trainable_bytes: int  # the adapter's parameters
    head_rows: int  # tokens the LM head takes at a time (`logits_chunk_rows` unless set)

    @classmethod
    def of(cls, model: Any, trainable: list[torch.nn.Parameter]) -> StepMemory:
        config = model.config
        get = getattr(config, "get_text_config", None)
        config = get() if callable(get) else config
        hidden = int(config.hidden_size)
        heads = int(getattr(config, "num_attention_heads", 1) or 1)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        first = next(model.parameters())
        vocab = int(config.vocab_size)
        return cls(
            layers=int(config.num_hidden_layers),
            hidden=hidden,
            intermediate=int(getattr(config, "intermediate_size", None) or 4 * hidden),
            q_dim=heads * head_dim,
            kv_dim=kv_heads * head_dim,
            vocab=vocab,
            dtype_bytes=first.element_size(),
            trainable_bytes=sum(p.numel() * p.element_size() for p in trainable),
            head_rows=logits_chunk_rows(vocab),
        )

    def layer_bytes_per_token(self) -> int:
        """What one decoder layer saves for backward per token (no checkpointing)."""
        h, i, q, kv = self.hidden, self.intermediate, self.q_dim, self.kv_dim
        # 8 hidden-sized tensors (norm inputs/outputs, residuals, attention and MLP
        # outputs), 4 intermediate-sized (gate, up, activation, product), q/k/v before
        # and after rotary, the attention output; the norms also keep float32 copies.
        elements = 8 * h + 4 * i + 3 * q + 3 * kv
        return elements * self.dtype_bytes + 2 * h * 4

    def bytes_per_token(self, checkpointed: bool) -> int:
        """Activation bytes per token of a micro-batch, backward's transients included."""
        return self.bytes_per_token_checkpointing(self.layers if checkpointed else 0)

    def bytes_per_token_checkpointing(self, layers: int) -> int:
        """`bytes_per_token` with `layers` of the decoder layers checkpointed (0 to all)."""
        layer = self.layer_bytes_per_token()
        if layers <= 0:
            return self.layers * layer + layer
        # A checkpointed layer keeps only its input; backward recomputes one such layer at
        # a time and holds its activations, their gradients and the recompute's
        # temporaries. The others keep all they save, as without checkpointing.
        layers = min(layers, self.layers)
        kept = (self.layers - layers) * layer
        return kept + layers * self.hidden * self.dtype_bytes + 3 * layer

    def fixed_bytes(self) -> int:
        """Workspace of a step whatever its length: the LM-head chunk, gradients, AdamW."""
        chunk = self.head_rows * self.vocab * 4  # float32 [rows x vocabulary]
        head = 4 * chunk  # logits, their float32 copy, softmax, gradient
        return head + 3 * self.trainable_bytes

    def step_bytes(self, tokens: int, checkpointed: bool) -> int:
        """Estimated bytes a micro-batch of `tokens` tokens adds to the process at its peak."""
        return self.step_bytes_checkpointing(tokens, self.layers if checkpointed else 0)

    def step_bytes_checkpointing(self, tokens: int, layers: int) -> int:
        """`step_bytes` with `layers` of the decoder layers checkpointed (0 to all)."""
        raw = tokens * self.bytes_per_token_checkpointing(layers) + self.fixed_bytes()
        return int(raw * _SAFETY)

    def layers_to_checkpoint(self, tokens: int, available: int) -> int:
        """The fewest decoder layers to checkpoint so a micro-batch of `tokens` tokens fits
        in `available` bytes (`step_bytes_checkpointing`); all of them where none does."""
        for layers in range(self.layers + 1):
            if self.step_bytes_checkpointing(tokens, layers) <= available:
                return layers
        return self.layers

    def capacity(self, available: int, checkpointed: bool) -> int:
        """Most tokens one micro-batch may hold within `available` bytes (0: none fit)."""
        room = available / _SAFETY - self.fixed_bytes()
        return max(0, int(room // self.bytes_per_token(checkpointed)))


def logits_chunk_rows(vocab: int) -> int:
    """Rows of [rows x vocabulary] float32 logits that fit in `LOGITS_CHUNK_BYTES`."""
    return max(16, LOGITS_CHUNK_BYTES // (4 * vocab))


@dataclass(frozen=True)
class Budget:
    """How much memory a step may use: the limit and what is in use already (bytes)."""

    limit: int
    in_use: int
    configured: bool  # from TrainerArgs.memory_budget_gb, not the machine

    @property
    def available(self) -> int:
        return max(0, self.limit - self.in_use)


def budget(device: torch.device, memory_budget_gb: float | None) -> Budget:
    """The memory budget of a step on `device`: the configured one, else the machine's.

    On CPU the budget is for the whole process (its RSS); on CUDA for torch's allocations
    on the device.
    """
    in_use = _device_in_use(device)
    if memory_budget_gb is not None:
        return Budget(int(memory_budget_gb * GIB), in_use, configured=True)
    return Budget(in_use + int(_device_free(device) * _AVAILABLE_SHARE), in_use, configured=False)


def _device_in_use(device: torch.device) -> int:
    if device.type == "cuda":
        import torch

        return int(torch.cuda.memory_allocated(device))
    return _status_bytes("VmRSS")


def _device_free(device: torch.device) -> int:
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        # Memory torch's caching allocator holds but no tensor uses is free to us too.
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + cached)
    free = _meminfo_bytes("MemAvailable")
    limit = _cgroup_room()
    return free if limit is None else min(free, limit)


def _status_bytes(field: str) -> int:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _meminfo_bytes(field: str) -> int:
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:  # not Linux: assume what the process could see is what it has
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _cgroup_room() -> int | None:
    # A container's memory limit (cgroup v2) binds before the host's free memory does.
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        current = int((root / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    if limit == "max":
        return None
    return max(0, int(limit) - current)


# glibc's mallopt parameter number for the mmap threshold (malloc.h).
_M_MMAP_THRESHOLD = -3
# Blocks of this size or more are mapped on their own while a CPU step trains. Not lower:
# each mapping is faulted in afresh, and an elementwise op writing a fresh 3.4 MB block ran
# 16x slower mapped than from the heap (1.4 ms against 0.08). With 256 KiB, SFT steps of
# ~560-token rows took 58 s, with 4 MiB 33-36 s, for a peak RSS of 1.84 and 2.29 GiB; one
# step of 8 x 2,048-token agent trajectories peaked at 1.98 and 2.27 GiB in 304 and 312 s
# (default model, float32, 2 cores, 2026-11-27). A long sequence's activations are larger
# than this, so they still leave the RSS at once; glibc's own ceiling (the heap for every
# block under 32 MiB) kept 5.36 GiB resident on the same step.
_MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024
# A checkpointed micro-batch (a sequence over CHECKPOINT_ABOVE_TOKENS) maps blocks of this
# size or more on their own. At 4 MiB a ~1,100-token sequence's hidden states (2.5 MB each)
# came from the heap, which kept them: a step on a 2,048- and a 1,024-token agent answer
# peaked at 2.96 GiB against 2.14 with 1 MiB, two 2,048-token answers at 2.35 against 2.08,
# in the same seconds (50 s and 71 s; default model, float32, 2 cores, 2026-11-29), and
# `benchmarks/train_memory.py --settings 8x2048` at 1.99 GiB in 272 s (2.28 in 296). Rows
# that are not checkpointed keep 4 MiB: eight ~520-token sequences took 30 s at 4 MiB and
# 42 s at 1 MiB (peaks 3.70 and 2.72 GiB).
_LONG_ROWS_MMAP_THRESHOLD_BYTES = 1024 * 1024
# glibc's own ceiling for its dynamic threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX).
_DECODING_MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024


class ProcessMemory:
    """The one owner of the memory state training steps change for the whole process.

    glibc's mmap threshold and the peak-memory counters (VmHWM on CPU, torch's peak
    statistics per CUDA device) belong to the process, not to a step, and steps may
    overlap: two models on different bases train at once in two threads, and in dedicated
    mode on the CPU the engine decodes while a step trains. So steps in progress are
    counted under one lock: the threshold is lowered when the first step asking for it
    starts and restored when the last one ends, and a peak counter is reset only by a step
    that starts while no other step on that device is in progress. Use the process's one
    instance, `PROCESS_MEMORY`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # What each scope inside `large_frees_returned` asked for; the lowest applies.
        self._lowering: list[int] = []
        self._measuring: dict[str, int] = {}  # steps in progress measuring a peak, by device
        self._threshold: int | None = None

    @property
    def mmap_threshold(self) -> int | None:
        """The mmap threshold (bytes) this process last set; None: never set (glibc has no
        getter, so this is what we set, not what the environment may have fixed)."""
        return self._threshold

    @contextlib.contextmanager
    def large_frees_returned(self, threshold: int = _MMAP_THRESHOLD_BYTES) -> Iterator[None]:
        """While training on a CPU: freed activations leave the RSS at once (glibc).

        glibc raises its mmap threshold each time a large mmapped block is freed (up to 32
        MiB); after that, blocks under it come from the heap and, once freed, stay in the
        RSS. A training step's activations are such blocks, so the RSS kept what every
        layer had ever held: on the default model, 0.84 MB per token with gradient
        checkpointing against 0.17 MB of live tensors. Inside, every block of 4 MiB or
        more is its own mapping, unmapped when freed (`_MMAP_THRESHOLD_BYTES` says why not
        less): a long sequence's activations. A scope may ask for a lower `threshold` (a
        checkpointed micro-batch: `long_rows_returned`); while scopes overlap, in one step
        or in steps of several threads, the lowest asked for applies. When the last scope
        leaves, the threshold is set to glibc's ceiling: a decode step's logits and temporaries
        (megabytes, every step) come from the heap again; mapping and faulting them in
        afresh each step cost the decode loop ~30% of its throughput at 32 rows (measured
        on the default model, 2 cores). Does nothing off glibc or when
        `MALLOC_MMAP_THRESHOLD_` is set.
        """
        with self._lock:
            self._lowering.append(threshold)
            self._apply()
        try:
            yield
        finally:
            with self._lock:
                self._lowering.remove(threshold)
                self._apply()

    def _apply(self) -> None:
        self._set_mmap_threshold(min(self._lowering, default=_DECODING_MMAP_THRESHOLD_BYTES))

    def _set_mmap_threshold(self, value: int) -> None:
        libc = _glibc()
        if libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, value) == 1:
            self._threshold = value

    def start_peak(self, device: torch.device) -> None:
        """A step on `device` starts measuring: the counter is reset if no other is."""
        key = str(device)
        with self._lock:
            running = self._measuring.get(key, 0)
            self._measuring[key] = running + 1
            if running == 0:
                _reset_peak(device)

    def stop_peak(self, device: torch.device) -> None:
        key = str(device)
        with self._lock:
            self._measuring[key] -= 1
            if not self._measuring[key]:
                del self._measuring[key]


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats(device)
        return
    # Writing 5 resets the process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0).
    # Where that fails the peak is the process's lifetime peak, still an upper bound.
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _glibc() -> ctypes.CDLL | None:
    """glibc, where its mmap threshold is ours to set (not fixed by the environment)."""
    if sys.platform != "linux" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # musl and others: no glibc to configure
        return None


PROCESS_MEMORY = ProcessMemory()


def release_free_memory() -> None:
    """Give the heap's free pages back to the system (glibc's `malloc_trim`), once the
    objects that held them are gone: after a model is unloaded, say."""
    gc.collect()  # models hold reference cycles (modules and their hooks)
    return_free_heap()


def return_free_heap() -> None:
    """`release_free_memory` without the garbage collection: the heap's free pages back
    to the system, cheap enough for an engine that has just gone idle."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def large_frees_returned() -> contextlib.AbstractContextManager[None]:
    """`PROCESS_MEMORY.large_frees_returned()`: the low mmap threshold while a CPU step trains."""
    return PROCESS_MEMORY.large_frees_returned()


def long_rows_returned() -> contextlib.AbstractContextManager[None]:
    """The lower threshold of a checkpointed micro-batch, inside a step's
    `large_frees_returned` (`_LONG_ROWS_MMAP_THRESHOLD_BYTES` says why)."""
    return PROCESS_MEMORY.large_frees_returned(_LONG_ROWS_MMAP_THRESHOLD_BYTES)


class PeakMemory:
    """Peak memory of the process between `start()` and `stop()`: RSS on CPU, torch's
    allocations on CUDA.

    The counter is the process's (or the device's), so when steps overlap it is reset only
    by the first to start, and a step's peak may include an overlapping step's memory.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._started = False
        self._final: float | None = None  # the peak when `stop()` was called

    def start(self) -> None:
        if self._started:
            raise RuntimeError("PeakMemory.start() was called twice; make one per step")
        self._started = True
        PROCESS_MEMORY.start_peak(self.device)

    def stop(self) -> None:
        """End the measurement; `peak_gib()` keeps the peak it had reached."""
        if self._started and self._final is None:
            self._final = self._read()
            PROCESS_MEMORY.stop_peak(self.device)

    def peak_gib(self) -> float:
        return self._read() if self._final is None else self._final

    def _read(self) -> float:
        if self.device.type == "cuda":
            import torch

            return torch.cuda.max_memory_allocated(self.device) / GIB
        return _status_bytes("VmHWM") / GIB


__all__ = [
    "GIB",
    "PROCESS_MEMORY",
    "Budget",
    "PeakMemory",
    "ProcessMemory",
    "StepMemory",
    "budget",
    "large_frees_returned",
    "logits_chunk_rows",
    "release_free_memory",
    "return_free_heap",
]
