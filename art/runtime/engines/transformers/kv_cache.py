"""The decode loop's KV cache: preallocated, so a decode step does not copy it.

transformers' `DynamicLayer` concatenates each new token's keys and values onto the
whole cache, every layer, every step: the cache is copied once per token, which on a
CPU cost a decode step more than its attention. `GrowingLayer` (a `DynamicLayer`, the
extension point `Cache(layer_class_to_replicate=...)` takes) writes each token into
spare room at the end of a buffer and hands attention a view of the filled part; the
buffer is reallocated with room to spare only when it is full.

The running batch changes its rows in place too: a finished row's place is taken by a
row from below (`keep_rows`), and requests joining mid-flight are written into spare
rows below the running ones (`join`), their left padding zeroed, so neither copies the
rows that stay. Only a join that finds no room (rows, or positions to the left for a
prompt longer than the running rows) copies the whole cache into a new buffer.

A static decode step (`decode_graphs.py`, a GPU's) attends over the whole room, masked
where not yet written, and a masked weight of 0 times an uninitialised NaN would still be
NaN: its caches' room is zeros (`reserve` zeroes what is there and every buffer after
it), as is every buffer on a GPU. Otherwise, on a CPU, every step attends over the
filled positions only (`keys`/`values`), each of them written (a token's keys, or a
join's zeroed left padding), so the room is left uninitialised: zeroing it was ~1.4% of
a busy CPU decode loop's op time, and the untouched room of a large buffer takes no
memory until it is written (the operating system maps its pages on first write).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

_SPARE_MIN = 64  # tokens of room added at least when a buffer is (re)allocated
_SPARE_ROWS_MIN = 8  # rows of room added at least when a join reallocates


class GrowingLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """One layer's keys and values: `keys`/`values` are views of the first `rows` rows'
    filled positions, `start` to `length`, of buffers with room for more of both."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]
        self._key_buffer = torch.empty(0)  # [row room, kv heads, position room, head dim]
        self._value_buffer = torch.empty(0)
        self.rows = 0  # rows in use: the first of the buffers'
        self.start = 0  # positions before it were trimmed off (padding no row attends to)
        self.length = 0  # positions written; keys/values are [start:length] of the buffers
        self.zeroed = False  # whether the room is zeros: a static step's cache (`reserve`)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if not self.length:
            self.rows = key_states.shape[0]
        self._reserve(self.length + new, key_states, value_states)
        rows = self.rows
        self._key_buffer[:rows, :, self.length : self.length + new].copy_(key_states)
        self._value_buffer[:rows, :, self.length : self.length + new].copy_(value_states)
        self._set_length(self.length + new)
        return self._filled(keys=True), self._filled(keys=False)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.length:
            self._key_buffer = self._key_buffer[: self.rows][indices]
            self._value_buffer = self._value_buffer[: self.rows][indices]
            self.rows = len(indices)
            self._set_length(self.length)

    def keep_rows(self, order: list[int]) -> None:
        """Keep the rows `order` (see `batch.compacted`): row i becomes row `order[i]`,
        which is i itself or a row from below the kept ones, moved up into a leaving
        row's place. Only the moved rows' filled positions are copied; the buffers keep
        their room (`batch_select_indices` copies every kept row into new buffers)."""
        if not self.length:
            return
        moves = [(i, source) for i, source in enumerate(order) if source != i]
        if moves:
            places = torch.tensor([i for i, _ in moves], device=self._key_buffer.device)
            sources = torch.tensor([source for _, source in moves], device=places.device)
            filled = slice(self.start, self.length)
            for buffer in (self._key_buffer, self._value_buffer):
                buffer[places, :, filled] = buffer[sources, :, filled]
        self.rows = len(order)
        self._set_length(self.length)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.length:
            self._key_buffer = self._key_buffer[: self.rows].repeat_interleave(repeats, dim=0)
            self._value_buffer = self._value_buffer[: self.rows].repeat_interleave(repeats, dim=0)
            self.rows *= repeats
            self._set_length(self.length)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        self._set_length(max(self.start, self.length + tokens_to_remove))

    def trim_left(self, positions: int) -> None:
        """Drop the first `positions` cached positions; the view moves, nothing is copied."""
        self.start = min(self.length, self.start + positions)
        self._set_length(self.length)

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = torch.empty(0)
        self.rows = self.start = self.length = 0
        super().reset()

    def reserve(self, rows: int, positions: int) -> None:
        """Buffers with room for at least `rows` rows and `positions` positions (counted from
        the buffers' start): reallocated, with the filled part copied, only where short."""
        if not self.zeroed:  # a static step attends over the whole room from now on
            self.zeroed = True
            self._zero_room()
        room_rows, room_positions = self.room
        if room_rows >= rows and room_positions >= positions:
            return
        self._reallocate(
            max(rows, room_rows), max(positions, self.length - self.start), *self.buffers()
        )
        self._set_length(self.length)

    def _zero_room(self) -> None:
        """Zeros wherever the buffers hold no filled position."""
        for buffer in self.buffers():
            if buffer.dim() == 4:
                buffer[self.rows :].zero_()
                buffer[: self.rows, :, : self.start].zero_()
                buffer[: self.rows, :, self.length :].zero_()

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole key and value buffers ([row room, kv heads, position room, head dim]):
        for a decode step that writes position `length` itself (`decode_graphs.py`)."""
        return self._key_buffer, self._value_buffer

    def advance(self) -> None:
        """Count position `length` as written (by whoever wrote it into `buffers()`)."""
        self._set_length(self.length + 1)

    @property
    def nbytes(self) -> int:
        """Bytes of both buffers."""
        return self._key_buffer.nbytes + self._value_buffer.nbytes

    @property
    def room(self) -> tuple[int, int]:
        """Rows and positions the buffers hold before they must be reallocated."""
        buffer = self._key_buffer
        return (buffer.shape[0], buffer.shape[2]) if buffer.dim() == 4 else (0, 0)

    def join(self, other: GrowingLayer, length: int) -> None:
        """Append `other`'s rows below this layer's, both left-padded to `length` positions.

        In place where the buffers have the rows, and the positions on the left a longer
        newcomer needs (trimmed padding): the newcomers are written into spare rows.
        Otherwise both are written into new buffers, with spare rows for the next joins.
        Either way each side's left padding is zeroed (masked, but a masked weight of 0
        times an uninitialised NaN would still be NaN) and nothing is copied twice."""
        mine = self.length - self.start
        rows, added = self.rows, other.rows
        extra = length - mine  # positions the running rows gain on the left
        parts = [
            (self._filled(keys=True), other._filled(keys=True)),
            (self._filled(keys=False), other._filled(keys=False)),
        ]
        in_place = self.room[0] >= rows + added and extra <= self.start
        if in_place:
            self.start -= extra
        else:
            self.start = self.length = 0
            self.rows = rows + added
            spare_rows = max(_SPARE_ROWS_MIN, self.rows // 4)
            self._reserve(length, parts[0][1], parts[1][1], fresh=True, spare_rows=spare_rows)
            self.length = length
        end = self.length
        for own, (running, newcomers) in zip(
            (self._key_buffer, self._value_buffer), parts, strict=True
        ):
            window = own[:, :, end - length : end]
            if in_place:  # the running rows are where they were, but for the positions gained
                window[:rows, :, :extra].zero_()
            else:
                _write_left_padded(window[:rows], running)
            _write_left_padded(window[rows : rows + added], newcomers)
        self.rows = rows + added
        self._set_length(end)

    def _reserve(
        self,
        needed: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        fresh: bool = False,
        spare_rows: int = 0,
    ) -> None:
        """Room for `needed` positions of `self.rows` rows shaped like `keys`, and
        `spare_rows` more rows where it reallocates; `fresh` always reallocates. A
        reallocation does not keep the old buffers' spare rows: after a wide batch has
        dwindled to a few long rows, those would be held at every new length."""
        buffer = self._key_buffer
        fits = buffer.dim() == 4 and buffer.shape[0] >= self.rows and buffer.shape[2] >= needed
        if fits and not fresh:
            return
        needed -= self.start
        capacity = needed + max(_SPARE_MIN, needed // 2)
        self._reallocate(self.rows + spare_rows, capacity, keys, values)

    def _reallocate(
        self, rows: int, positions: int, keys: torch.Tensor, values: torch.Tensor
    ) -> None:
        """New buffers of `rows` x `positions`, heads and head dim as `keys`/`values`,
        holding the kept positions from their start (trimmed ones are not copied)."""
        kept = self.length - self.start
        zeroed = self.zeroed or keys.device.type != "cpu"
        key_buffer = _room(keys, (rows, keys.shape[1], positions, keys.shape[3]), zeroed)
        value_buffer = _room(values, (rows, values.shape[1], positions, values.shape[3]), zeroed)
        if kept:
            key_buffer[: self.rows, :, :kept].copy_(self._filled(keys=True))
            value_buffer[: self.rows, :, :kept].copy_(self._filled(keys=False))
        self._key_buffer, self._value_buffer = key_buffer, value_buffer
        self.start, self.length = 0, kept

    def _set_length(self, length: int) -> None:
        self.length = length
        self.keys = self._filled(keys=True)
        self.values = self._filled(keys=False)

    def _filled(self, *, keys: bool) -> torch.Tensor:
        """A view of the `rows` rows' `start:length` positions of the key or value buffer."""
        buffer = self._key_buffer if keys else self._value_buffer
        return buffer[: self.rows, :, self.start : self.length]


def _room(like: torch.Tensor, shape: tuple[int, ...], zeroed: bool) -> torch.Tensor:
    """A new buffer of `shape`: zeros, or uninitialised (module docstring)."""
    return like.new_zeros(shape) if zeroed else like.new_empty(shape)


def cache_bytes(cache: Cache) -> int:
    """Bytes the cache's buffers hold (their room, filled or not)."""
    return sum(layer.nbytes for layer in cache.layers if isinstance(layer, GrowingLayer))


def new_cache() -> Cache:
    """An empty cache whose layers are `GrowingLayer`s, added as the model fills them."""
    return Cache(layer_class_to_replicate=GrowingLayer)


def with_prefix(prefix: list[tuple[torch.Tensor, torch.Tensor]], rows: int) -> Cache:
    """A cache of `rows` rows, each holding `prefix` (per layer keys and values of one row)."""
    layers: list[Any] = []
    for keys, values in prefix:
        layer = GrowingLayer()
        layer.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1))
        layers.append(layer)
    return Cache(layers=layers)


def row_prefix(
    cache: Cache, row: int, length: int, gap_at: int = 0, gap: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of the first `length` cached positions of `row`, per layer (for `with_prefix`),
    skipping `gap` positions from `gap_at` on: the left padding of a row laid out as
    [prefix | padding | rest of the prompt]."""
    prefix = []
    for layer in cache.layers:
        assert isinstance(layer, GrowingLayer)
        parts = []
        for tensor in (layer._filled(keys=True), layer._filled(keys=False)):
            kept = tensor[row : row + 1, :, : length + gap]
            if gap:  # the concatenation is a copy already
                parts.append(torch.cat([kept[:, :, :gap_at], kept[:, :, gap_at + gap :]], dim=2))
            else:
                parts.append(kept.clone())
        prefix.append((parts[0], parts[1]))
    return prefix


def join(running: Cache, new: Cache, length: int) -> None:
    """Append `new`'s rows to `running` in place, both left-padded (masked) to `length`."""
    for running_layer, new_layer in zip(running.layers, new.layers, strict=True):
        assert isinstance(running_layer, GrowingLayer)
        assert isinstance(new_layer, GrowingLayer)
        running_layer.join(new_layer, length)


def keep_rows(cache: Cache, order: list[int]) -> None:
    """`GrowingLayer.keep_rows` on every layer."""
    for layer in cache.layers:
        assert isinstance(layer, GrowingLayer)
        layer.keep_rows(order)


def trim_left(cache: Cache, positions: int) -> None:
    """Drop the first `positions` cached positions of every layer (padding no row needs)."""
    for layer in cache.layers:
        assert isinstance(layer, GrowingLayer)
        layer.trim_left(positions)


def _write_left_padded(target: torch.Tensor, source: torch.Tensor) -> None:
    """`source` into the last positions of `target` (dim 2), zeros before it."""
    padding = target.shape[2] - source.shape[2]
    target[:, :, :padding].zero_()
    target[:, :, padding:].copy_(source)


__all__ = [
    "GrowingLayer",
    "join",
    "keep_rows",
    "new_cache",
    "row_prefix",
    "trim_left",
    "with_prefix",
]
