"""`art.serve.tinker.wire` against the `tinker` SDK's own protobuf code: what the SDK
encodes, we read; what we write, the SDK decodes."""

from __future__ import annotations

import math

import pytest

from art.core.data.errors import ConfigError
from art.serve.tinker.wire import forward_backward_output, read_forward_backward, sample_response

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402
from tinker.proto import response_conv  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402


def encoded(data: list[types.Datum], loss: str, config: dict[str, float | str] | None) -> bytes:
    request = types.ForwardBackwardRequest(
        model_id="s1:train:0",
        seq_id=7,
        forward_backward_input=types.ForwardBackwardInput(
            data=data, loss_fn=loss, loss_fn_config=config
        ),
    )
    return bytes(forward_backward_request_to_proto(request).SerializeToString())


def test_a_request_the_sdk_encodes_reads_back_whole() -> None:
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7, 2**31 - 1]),
        loss_fn_inputs={
            "target_tokens": [6, 7, 8, 9],
            "logprobs": [-0.5, -1.25, -2.0, 0.0],
            "advantages": [0.0, 1.5, -1.5, 0.25],
        },
    )
    short = types.Datum(
        model_input=types.ModelInput.from_ints([1]),
        loss_fn_inputs={"target_tokens": [2], "logprobs": [-3.0], "advantages": [1.0]},
    )
    parsed = read_forward_backward(
        encoded([datum, short], "ppo", {"clip_low_threshold": 0.7, "mode": "x"})
    )
    assert (parsed.model_id, parsed.seq_id, parsed.loss_fn) == ("s1:train:0", 7, "ppo")
    assert parsed.forward_only is False
    assert parsed.loss_fn_config == {"clip_low_threshold": pytest.approx(0.7), "mode": "x"}
    assert [d.tokens for d in parsed.data] == [[5, 6, 7, 2**31 - 1], [1]]
    first = parsed.data[0].inputs
    assert first["target_tokens"].values == [6, 7, 8, 9]  # int64 on the wire
    assert first["logprobs"].values == [-0.5, -1.25, -2.0, 0.0]  # float32
    assert first["advantages"].shape == [4]


def test_what_we_write_the_sdk_decodes() -> None:
    outputs = [
        {"logprobs": [-0.5, -1.5, -2.5], "elementwise_loss": [0.0, 1.0, 2.0]},
        {"logprobs": [-0.25], "elementwise_loss": [3.0]},
    ]
    decoded = response_conv.deserialize_forward_backward_output(
        forward_backward_output(outputs, {"loss:sum": 6.0})
    )
    assert decoded.metrics == {"loss:sum": 6.0}
    assert [o["logprobs"].tolist() for o in decoded.loss_fn_outputs] == [
        [-0.5, -1.5, -2.5],
        [-0.25],
    ]
    assert decoded.loss_fn_outputs[1]["elementwise_loss"].tolist() == [3.0]

    sampled = response_conv.deserialize_sample_response(
        sample_response(
            [([4, 5], [-0.1, -0.2], True), ([6], [-0.3], False)], [math.nan, -1.0, -2.0]
        )
    )
    assert [list(s.tokens) for s in sampled.sequences] == [[4, 5], [6]]
    assert [s.stop_reason for s in sampled.sequences] == ["stop", "length"]
    assert sampled.sequences[0].logprobs == pytest.approx([-0.1, -0.2])
    assert sampled.prompt_logprobs == [None, -1.0, -2.0]
    assert (
        response_conv.deserialize_sample_response(sample_response([], None)).prompt_logprobs is None
    )


def test_what_is_not_served_or_not_protobuf_is_refused_by_name() -> None:
    import torch

    sparse = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_torch_sparse(
                torch.tensor([[0, 0, 0, 5], [0, 0, 0, 0]])
            ),
            "weights": [1.0, 1.0],
        },
    )
    with pytest.raises(ConfigError, match=r"data\[0\]\.loss_fn_inputs\.target_tokens"):
        read_forward_backward(encoded([sparse], "cross_entropy", None))
    with pytest.raises(ConfigError, match="not a ForwardBackwardRequest"):
        read_forward_backward(b"\x0a\xff\xff\xff\x0f")
