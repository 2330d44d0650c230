"""Decode steps on a GPU replayed from CUDA graphs: one launch a step, not hundreds.

On a GPU a decode step of the lean decoder (`lean_decode.py`) is ~25 small kernels a
layer; launched one by one from Python, the step costs the host's time per launch, not
the GPU's, and grows with the layers, not with the rows. Measured on an H200 (#49), a
1B-shaped model decoding 64 rows through transformers' module stack reached 0.4% of
what its memory bandwidth allows. Here a step's kernels are captured once as a CUDA
graph and replayed: the host launches the graph, and the GPU runs the kernels back to
back.

A graph replays fixed addresses and shapes, so each step runs over static buffers: the
rows padded up to a bucket (a power of two), the keys and values attended over the
cache's whole position room (positions not yet written, and the left padding, masked),
and the new token's keys and values written at the cache's next position
(`GrowingLayer.buffers()`, `advance()`). A graph is kept for each bucket and set of
cache buffers; the cache's room grows in powers of two (at least `_MIN_POSITIONS`), so a
batch of rows decoding a few hundred tokens is captured once or twice. Padding rows
compute numbers that no real row reads (every op of the step is row-wise), kept finite:
their keys and values land in the cache's spare rows.

`StaticDecoder(graphs=False)` runs the same static-buffer step without capturing it, so
the CPU tests hold everything but the capture itself to the lean decoder's own step.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from .kv_cache import GrowingLayer
from .lean_decode import KeysValues, LeanDecoder

logger = logging.getLogger("art.engine")

_MIN_POSITIONS = 256  # the cache's position room is a power of two, at least this
_MAX_GRAPHS = 16  # graphs kept (least recently used dropped); each holds its inputs' room


@dataclass
class _Step:
    """One bucket's static inputs, its output, and its graph (None: run eagerly)."""

    rows: int
    capacity: int
    tokens: torch.Tensor  # [rows]
    positions: torch.Tensor  # [rows, 1]
    mask: torch.Tensor  # [rows, 1, capacity, 1]: 0 where attended, -inf elsewhere
    write_at: torch.Tensor  # [1]: the cache position the step writes
    logits: torch.Tensor | None = None  # [rows, vocab], the graph's output
    graph: Any = None  # torch.cuda.CUDAGraph


def bucket(rows: int) -> int:
    """The padded row count a step of `rows` rows runs at: the next power of two."""
    return 1 << max(0, rows - 1).bit_length()


def position_room(positions: int) -> int:
    """The cache room for `positions` positions: the next power of two, at least
    `_MIN_POSITIONS`."""
    return max(_MIN_POSITIONS, bucket(positions))


class StaticDecoder:
    """`LeanDecoder.step`'s contract, over static buffers; with `graphs`, each bucket's step
    captured as a CUDA graph on its first use and replayed after."""

    def __init__(self, lean: LeanDecoder, *, graphs: bool) -> None:
        self.lean = lean
        self.model = lean.model
        self.graphs = graphs
        self.captured = 0  # graphs captured so far (each costs a step's warm-up)
        self._steps: OrderedDict[tuple[int, ...], _Step] = OrderedDict()
        self._pool: Any = torch.cuda.graph_pool_handle() if graphs else None
        self._stream: Any = None  # the side stream graphs are captured on

    @property
    def steps_kept(self) -> int:
        """Static steps held now, one per bucket and set of cache buffers (each a graph's
        where `graphs`)."""
        return len(self._steps)

    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        attention: torch.Tensor,
        cache: Any,
    ) -> torch.Tensor:
        """Float32 next-token logits [rows, vocab], as `LeanDecoder.step` gives them."""
        rows = tokens.shape[0]
        layers: list[GrowingLayer] = list(cache.layers)
        first = layers[0]
        padded, room = bucket(rows), position_room(first.length + 1)
        for layer in layers:
            layer.reserve(padded, room)
        # Read after `reserve`: a reallocation moves the kept positions to the buffers' start.
        length, start = first.length, first.start
        key = (
            padded,
            first.room[1],
            *(buffer.data_ptr() for layer in layers for buffer in layer.buffers()),
        )
        static = self._steps.get(key)
        if static is None:
            static = self._new_step(padded, first.room[1], tokens.device)
        else:
            self._steps.move_to_end(key)
        static.tokens[:rows].copy_(tokens)
        static.positions[:rows].copy_(positions)
        static.mask[:rows].fill_(float("-inf"))
        window = static.mask[:rows, 0, start : length + 1, 0]
        window.masked_fill_(attention != 0, 0.0)
        # Padding rows attend to everything (zeros, or what earlier steps wrote): a row
        # masked whole would be NaN, and its keys and values are written into the cache's
        # spare rows, where a joining row's masked padding would take them.
        static.mask[rows:].zero_()
        static.write_at.fill_(length)
        if static.logits is None:  # a new step: its first run (and capture) fills it
            self._first_run(static, layers)
            self._steps[key] = static
            while len(self._steps) > _MAX_GRAPHS:
                self._steps.popitem(last=False)
        elif static.graph is not None:
            static.graph.replay()
        else:
            static.logits = self._run(static, layers)
        for layer in layers:
            layer.advance()
        # A copy: the graph's output is overwritten by the next replay.
        assert static.logits is not None
        return static.logits[:rows].clone()

    def _new_step(self, rows: int, capacity: int, device: torch.device) -> _Step:
        return _Step(
            rows,
            capacity,
            tokens=torch.zeros(rows, dtype=torch.long, device=device),
            positions=torch.zeros((rows, 1), dtype=torch.long, device=device),
            mask=torch.zeros((rows, 1, capacity, 1), dtype=torch.float32, device=device),
            write_at=torch.zeros(1, dtype=torch.long, device=device),
        )

    def _run(self, static: _Step, layers: list[GrowingLayer]) -> torch.Tensor:
        buffers = [tuple(buffer[: static.rows] for buffer in layer.buffers()) for layer in layers]

        def store(index: int, key: torch.Tensor, value: torch.Tensor) -> KeysValues:
            keys, values = buffers[index]
            keys.index_copy_(2, static.write_at, key)
            values.index_copy_(2, static.write_at, value)
            return keys, values

        return self.lean.forward(static.tokens, static.positions, static.mask, store)

    def _first_run(self, static: _Step, layers: list[GrowingLayer]) -> None:
        if not self.graphs:
            static.logits = self._run(static, layers)
            return
        # Warm up (cuBLAS's handles and heuristics for these shapes) and capture on a side
        # stream, as torch's capture recipe says. Both write this step's keys and values at
        # the position the replay writes them again. Not `torch.cuda.graph()`: before each
        # capture it synchronises the device and empties the allocator's cache (in some
        # torch versions it runs `gc.collect()` too, hundreds of milliseconds in a serving
        # process), and a batch that rows join and leave captures again whenever its bucket
        # or its cache's buffers change.
        if self._stream is None:
            self._stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            self._run(static, layers)
            stream.synchronize()  # the warm-up's frees settled before the capture begins
            # thread_local: the engine's thread captures while other threads (the HTTP
            # server's) go on; none of them launches work on this stream.
            graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
            try:
                static.logits = self._run(static, layers)
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        static.graph = graph
        self.captured += 1
        logger.debug("captured a decode graph: %d rows, %d positions", static.rows, static.capacity)
        graph.replay()


__all__ = ["StaticDecoder", "bucket", "position_room"]
