"""The protobuf messages of Tinker's API that the `tinker` SDK sends and expects.

`forward_backward` requests arrive as `tinker_public.ForwardBackwardRequest`, and the
results of `forward_backward` and `asample` must go back as `ForwardBackwardOutput` and
`SampleResponse` (the SDK 0.38.0 refuses them as JSON). The schema is read from the SDK's
`proto/tinker_public_pb2.py`; field numbers are noted below.

Why by hand and not the protobuf runtime: it needs generated code (protoc) or descriptors
built field by field, both longer than the wire format of these five messages, and
`art serve` would gain a dependency that only this API uses.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from ...core.data.errors import ConfigError

# DType enum values.
FLOAT32, INT64, INT32, BFLOAT16 = 1, 2, 3, 4
_WIDTH = {FLOAT32: 4, INT64: 8, INT32: 4, BFLOAT16: 2}


@dataclass
class Tensor:
    values: list[float]
    shape: list[int]


@dataclass
class WireDatum:
    tokens: list[int]
    inputs: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class ForwardBackwardRequest:
    model_id: str = ""
    seq_id: int = 0
    data: list[WireDatum] = field(default_factory=list)
    loss_fn: str = ""
    loss_fn_config: dict[str, float | str] = field(default_factory=dict)
    forward_only: bool = False


# --- reading ---------------------------------------------------------------------------


def _varint(data: bytes, at: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, at
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of one message."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 1:
            value, at = data[at : at + 8], at + 8
        elif wire == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise ValueError("truncated field")
            value, at = data[at : at + length], at + length
        elif wire == 5:
            value, at = data[at : at + 4], at + 4
        else:
            raise ValueError(f"wire type {wire} is not used by this API")
        yield number, wire, value


def _bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise ValueError("a length-delimited field was expected")
    return value


def _int(value: int | bytes) -> int:
    if not isinstance(value, int):
        raise ValueError("a varint field was expected")
    return value


def _packed_ints(value: int | bytes) -> list[int]:
    if isinstance(value, int):
        return [value]
    values, at = [], 0
    while at < len(value):
        number, at = _varint(value, at)
        values.append(number)
    return values


def _numbers(raw: bytes, dtype: int) -> list[float]:
    if dtype == FLOAT32:
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    if dtype == INT64:
        return [float(v) for v in struct.unpack(f"<{len(raw) // 8}q", raw)]
    if dtype == INT32:
        return [float(v) for v in struct.unpack(f"<{len(raw) // 4}i", raw)]
    if dtype == BFLOAT16:
        halves = struct.unpack(f"<{len(raw) // 2}H", raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    raise ValueError(f"tensor dtype {dtype} is not known")


def _tensor(raw: bytes, where: str) -> Tensor:
    dense, dtype, shape = b"", 0, []
    for number, _, value in _fields(raw):
        if number == 1:
            dense = _bytes(value)
        elif number == 2:
            raise ConfigError(where, "sparse tensors are not served", "Send dense tensors")
        elif number == 3:
            dtype = _int(value)
        elif number == 4:
            shape += _packed_ints(value)
    if dtype not in _WIDTH or len(dense) % _WIDTH[dtype]:
        raise ConfigError(where, f"dtype {dtype} with {len(dense)} bytes", "Send float32 or int64")
    values = _numbers(dense, dtype)
    if math.prod(shape or [len(values)]) != len(values):
        raise ConfigError(where, f"shape {shape} holds not {len(values)} values", "Fix the shape")
    return Tensor(values, shape or [len(values)])


def _map_entry(raw: bytes) -> tuple[str, bytes | int]:
    key = ""
    entry: bytes | int = b""
    for number, _, value in _fields(raw):
        if number == 1:
            key = _bytes(value).decode()
        elif number == 2:
            entry = value
    return key, entry


def _datum(raw: bytes, index: int) -> WireDatum:
    where = f"forward_backward_input.data[{index}]"
    datum = WireDatum([])
    for number, _, value in _fields(raw):
        if number == 1:  # a Chunk: encoded_text = 1, image = 2, dmel = 3
            for kind, _, chunk in _fields(_bytes(value)):
                if kind != 1:
                    raise ConfigError(
                        f"{where}.model_input",
                        "image and dmel chunks are not served",
                        "Send encoded_text chunks (token ids) only",
                    )
                for inner, _, tokens in _fields(_bytes(chunk)):
                    if inner == 1:
                        raw_tokens = _bytes(tokens)
                        datum.tokens += struct.unpack(f"<{len(raw_tokens) // 4}i", raw_tokens)
        elif number == 2:
            key, tensor = _map_entry(_bytes(value))
            datum.inputs[key] = _tensor(_bytes(tensor), f"{where}.loss_fn_inputs.{key}")
        # 3, 4: provenance spans, which only stable_reinforce reads
    return datum


def read_forward_backward(raw: bytes) -> ForwardBackwardRequest:
    """Parse a `ForwardBackwardRequest`; `ConfigError` naming what is malformed."""
    request = ForwardBackwardRequest()
    config_v1: dict[str, float | str] = {}
    try:
        for number, _, value in _fields(raw):
            if number == 1:
                request.model_id = _bytes(value).decode()
            elif number == 2:
                request.seq_id = _int(value)
            elif number == 3:
                request.data.append(_datum(_bytes(value), len(request.data)))
            elif number == 4:
                request.loss_fn = _bytes(value).decode()
            elif number == 5:
                key, number_bytes = _map_entry(_bytes(value))
                config_v1[key] = struct.unpack("<d", _bytes(number_bytes))[0]
            elif number == 6:
                request.forward_only = bool(_int(value))
            elif number == 7:
                key, entry = _map_entry(_bytes(value))
                for kind, _, item in _fields(_bytes(entry)):
                    request.loss_fn_config[key] = (
                        struct.unpack("<d", _bytes(item))[0] if kind == 1 else _bytes(item).decode()
                    )
    except (ValueError, struct.error, UnicodeDecodeError) as error:
        raise ConfigError(
            "body", f"not a ForwardBackwardRequest: {error}", "Send it with the tinker SDK"
        ) from error
    # Numbers are written to both maps; strings only to the second.
    request.loss_fn_config = {**config_v1, **request.loss_fn_config}
    return request


# --- writing ---------------------------------------------------------------------------


def _key(number: int, wire: int) -> bytes:
    return _encode_varint(number << 3 | wire)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _encode_varint(len(payload)) + payload


def _double_entry(number: int, key: str, value: float) -> bytes:
    entry = _length_delimited(1, key.encode()) + _key(2, 1) + struct.pack("<d", value)
    return _length_delimited(number, entry)


def forward_backward_output(
    outputs: list[dict[str, list[float]]], metrics: dict[str, float]
) -> bytes:
    """A `ForwardBackwardOutput`: one ArrayRecord of float32 fields, one value per token."""
    record = _length_delimited(1, b"ArrayRecord")
    for name in outputs[0] if outputs else []:
        data = bytearray()
        offsets = [0]
        for output in outputs:
            data += struct.pack(f"<{len(output[name])}f", *output[name])
            offsets.append(len(data))
        batched = (
            _length_delimited(1, bytes(data))
            + _length_delimited(2, struct.pack(f"<{len(offsets)}q", *offsets))
            + _key(3, 0)
            + _encode_varint(FLOAT32)
        )
        entry = _length_delimited(1, name.encode()) + _length_delimited(2, batched)
        record += _length_delimited(2, entry)
    record += _key(3, 0) + _encode_varint(len(outputs))
    message = _length_delimited(1, b"ArrayRecord") + _length_delimited(2, record)
    for name, value in metrics.items():
        message += _double_entry(3, name, value)
    return message


def sample_response(
    sequences: list[tuple[list[int], list[float], bool]], prompt_logprobs: list[float] | None
) -> bytes:
    """A `SampleResponse`: each sequence's (tokens, logprobs, stopped), and the prompt's
    logprobs (NaN where there is none: the first token)."""
    message = b""
    for tokens, logprobs, stopped in sequences:
        sequence = _key(1, 0) + _encode_varint(0 if stopped else 1)
        sequence += _length_delimited(2, struct.pack(f"<{len(tokens)}i", *tokens))
        sequence += _length_delimited(3, struct.pack(f"<{len(logprobs)}f", *logprobs))
        message += _length_delimited(1, sequence)
    if prompt_logprobs is not None:
        message += _length_delimited(2, struct.pack(f"<{len(prompt_logprobs)}f", *prompt_logprobs))
    return message


__all__ = [
    "ForwardBackwardRequest",
    "Tensor",
    "WireDatum",
    "forward_backward_output",
    "read_forward_backward",
    "sample_response",
]
