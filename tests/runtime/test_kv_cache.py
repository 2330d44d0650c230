"""The decode loop's KV cache when rows leave the batch: the fewest rows move, and every
kept row's keys and values are what a full copy of the kept rows would hold."""

from __future__ import annotations

import torch

from art.runtime.engines.transformers.batch import compacted
from art.runtime.engines.transformers.kv_cache import GrowingLayer


def test_leaving_rows_places_are_taken_by_rows_from_below() -> None:
    assert compacted([0, 1, 3, 4, 6, 7]) == [0, 1, 6, 3, 4, 7]  # rows 2 and 5 left
    assert compacted([0, 1, 2]) == [0, 1, 2]  # the last rows left: nothing moves
    assert compacted([5, 6]) == [5, 6]  # the first rows left: every kept row moves
    assert compacted([]) == []


def test_kept_rows_hold_what_a_full_copy_of_them_would() -> None:
    generator = torch.Generator().manual_seed(0)

    def tensor(rows: int, positions: int) -> torch.Tensor:
        return torch.randn(rows, 2, positions, 4, generator=generator)

    keys, values = tensor(8, 7), tensor(8, 7)
    moved, copied = GrowingLayer(), GrowingLayer()
    for layer in (moved, copied):
        layer.update(keys, values)
        layer.trim_left(2)  # padding no row attends to, cut off
    spare = moved.room[1]
    order = compacted([0, 1, 3, 4, 6, 7])

    moved.keep_rows(order)
    copied.batch_select_indices(torch.tensor(order))

    assert torch.equal(moved.keys, copied.keys)
    assert torch.equal(moved.values, copied.values)
    assert torch.equal(moved.keys, keys[order][:, :, 2:])
    assert moved.room[1] == spare  # its room to grow kept
    # And both grow alike from there: the next token's keys and values land after them.
    new_keys, new_values = tensor(6, 1), tensor(6, 1)
    for got, want in zip(
        moved.update(new_keys, new_values), copied.update(new_keys, new_values), strict=True
    ):
        assert torch.equal(got, want)
    assert torch.equal(moved.keys[:, :, -1:], new_keys)


def _padded(tensor: torch.Tensor, length: int) -> torch.Tensor:
    return torch.nn.functional.pad(tensor, [0, 0, length - tensor.shape[2], 0])


def test_joining_rows_are_written_into_the_room_left_by_leaving_ones() -> None:
    """Newcomers shorter than the running rows, then one longer by less than the trimmed
    padding: both written in place below the running rows, left-padded with zeros (the
    running rows too, where the longer newcomer reaches further left); then a join with
    no room left reallocates. Every time the rows hold what a plain concatenation would."""
    generator = torch.Generator().manual_seed(1)

    def layer(rows: int, positions: int) -> tuple[GrowingLayer, torch.Tensor, torch.Tensor]:
        built = GrowingLayer()
        keys = torch.randn(rows, 2, positions, 4, generator=generator)
        values = torch.randn(rows, 2, positions, 4, generator=generator)
        built.update(keys, values)
        return built, keys, values

    running, keys, values = layer(8, 9)
    running.trim_left(3)
    running.keep_rows(compacted([0, 1, 2, 3, 4, 5]))  # two rows left: room for two
    want_keys, want_values = keys[:6, :, 3:], values[:6, :, 3:]
    storage = running.keys.untyped_storage().data_ptr()

    short, short_keys, short_values = layer(1, 4)
    running.join(short, 6)
    want_keys = torch.cat([want_keys, _padded(short_keys, 6)])
    want_values = torch.cat([want_values, _padded(short_values, 6)])
    assert torch.equal(running.keys, want_keys)
    assert torch.equal(running.values, want_values)

    longer, longer_keys, longer_values = layer(1, 8)  # 2 positions past the running rows'
    running.join(longer, 8)
    want_keys = torch.cat([_padded(want_keys, 8), longer_keys])
    want_values = torch.cat([_padded(want_values, 8), longer_values])
    assert torch.equal(running.keys, want_keys)
    assert torch.equal(running.values, want_values)
    assert running.keys.untyped_storage().data_ptr() == storage  # both joins in place

    crowd, crowd_keys, crowd_values = layer(3, 5)  # no room for 3 more rows
    running.join(crowd, 8)
    want_keys = torch.cat([want_keys, _padded(crowd_keys, 8)])
    want_values = torch.cat([want_values, _padded(crowd_values, 8)])
    assert torch.equal(running.keys, want_keys)
    assert torch.equal(running.values, want_values)
    assert running.keys.untyped_storage().data_ptr() != storage
    assert running.room[0] > running.rows  # room left for the next joins


def test_a_dwindled_batch_growing_does_not_keep_the_rows_that_left() -> None:
    """Rows leave without a copy, so the buffers keep the wide batch's rows until they grow:
    then only the rows still running are reallocated, at every longer length after."""
    layer = GrowingLayer()
    layer.update(torch.zeros(8, 2, 4, 4), torch.zeros(8, 2, 4, 4))
    layer.keep_rows(compacted([3]))
    assert layer.room[0] == 8  # left in place: nothing copied
    room = layer.room[1]
    for _ in range(room):  # past the buffers' room: they are reallocated
        layer.update(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))
    assert layer.room[0] == layer.rows == 1
    assert layer.keys.shape == (1, 2, 4 + room, 4)
    assert float(layer.keys[:, :, 4:].min()) == 1.0


def test_a_rows_prefix_skips_the_left_padding_between_prefix_and_rest() -> None:
    """A prefill from a cached prefix lays a row out as [prefix | left padding | rest];
    the prefix kept from it (`row_prefix`) is the prefix's positions and then the rest's,
    without the padding, in both keys and values."""
    from transformers import Cache

    from art.runtime.engines.transformers.kv_cache import row_prefix

    layer = GrowingLayer()
    positions = torch.arange(10, dtype=torch.float32)
    keys = positions.view(1, 1, 10, 1).expand(2, 1, 10, 1).clone()
    keys[1] += 100  # row 1 is told apart from row 0
    layer.update(keys, -keys)
    cache = Cache(layers=[layer])
    # Row 1: a 3-position prefix, 4 of padding (positions 3-6), then its own 3 positions;
    # its kept prefix is 5 long: the prefix and the first 2 of the rest.
    [(kept_keys, kept_values)] = row_prefix(cache, 1, 5, gap_at=3, gap=4)
    assert kept_keys.flatten().tolist() == [100.0, 101.0, 102.0, 107.0, 108.0]
    assert torch.equal(kept_values, -kept_keys)
    [(whole, _)] = row_prefix(cache, 0, 4)  # no padding: the first positions as they are
    assert whole.flatten().tolist() == [0.0, 1.0, 2.0, 3.0]


def _poison(layer: GrowingLayer) -> None:
    """NaN in every buffer position outside the filled view: what uninitialised room may hold."""
    for buffer in layer.buffers():
        filled = buffer[: layer.rows, :, layer.start : layer.length].clone()
        buffer.fill_(float("nan"))
        buffer[: layer.rows, :, layer.start : layer.length] = filled


def test_the_filled_view_never_shows_what_the_room_held() -> None:
    """On a CPU the buffers' room is left uninitialised, so every position `keys` and
    `values` show must have been written. With the room poisoned between operations, a
    token written, rows leaving, joins in place (a newcomer's left padding, and positions
    the running rows gain on the left) and a trim bring no NaN into the filled view."""
    generator = torch.Generator().manual_seed(2)

    def layer(rows: int, positions: int) -> GrowingLayer:
        built = GrowingLayer()
        shape = (rows, 2, positions, 4)
        built.update(
            torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
        )
        return built

    def clean(layer: GrowingLayer) -> bool:
        return not bool(layer.keys.isnan().any() or layer.values.isnan().any())

    running = layer(8, 9)
    storage = running.keys.untyped_storage().data_ptr()
    for operation in (
        lambda: running.trim_left(3),
        lambda: running.keep_rows(compacted([0, 1, 2, 4, 5, 7])),  # two rows left
        lambda: running.join(layer(1, 4), 6),  # shorter: its padding written into the room
        lambda: running.join(layer(1, 8), 8),  # longer: the running rows gain 2 on the left
        lambda: running.update(torch.ones(8, 2, 1, 4), torch.ones(8, 2, 1, 4)),
    ):
        _poison(running)
        operation()
        assert clean(running)
    assert running.keys.untyped_storage().data_ptr() == storage  # each in place
    assert running.keys.shape == (8, 2, 9, 4)


def test_a_static_steps_cache_has_zeros_in_its_room_from_reserve_on() -> None:
    """A static decode step attends over the whole room, masked: from `reserve` on the room
    is zeros (what was there, and every buffer reallocated after), whatever it held."""
    layer = GrowingLayer()
    layer.update(torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4))
    layer.trim_left(1)
    _poison(layer)
    storage = layer.keys.untyped_storage().data_ptr()
    layer.reserve(3, 8)  # fits the room the update made: zeroed in place
    assert layer.keys.untyped_storage().data_ptr() == storage
    assert all(bool(buffer.isfinite().all()) for buffer in layer.buffers())
    room = layer.room[1]
    layer.reserve(4, room + 1)  # past it: reallocated, with zeros
    assert all(bool(buffer.isfinite().all()) for buffer in layer.buffers())
    for buffer in layer.buffers():
        assert float(buffer[:, :, layer.length - layer.start :].abs().max()) == 0.0
