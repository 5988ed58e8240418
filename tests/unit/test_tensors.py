"""Tensors on the wire (``protocol/tensors.py``): every dtype and shape round trips; malformed items
are refused."""

from __future__ import annotations

import math
from typing import Any

import cbor2
import numpy as np
import pytest
import torch
from cbor2 import CBORTag
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edgeagent.errors import ProtocolError
from edgeagent.protocol.tensors import BOOL_TAG, MULTI_DIM_TAG, decode_tensor, encode_tensor
from tests.unit.protocol_samples import (
    assert_same_tensor,
)

SUPPORTED_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
]
NUMPY_DTYPE = {
    torch.bool: np.dtype(bool),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
}


def wire_round_trip(t: torch.Tensor) -> torch.Tensor:
    """Through real CBOR bytes, as on the network (cbor2 turns lists inside tags into tuples)."""
    return decode_tensor(cbor2.loads(cbor2.dumps(encode_tensor(t))))


@settings(max_examples=150, deadline=None)
@given(
    data=st.sampled_from(SUPPORTED_DTYPES).flatmap(
        lambda dt: hnp.arrays(
            NUMPY_DTYPE[dt],
            hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
        ).map(lambda arr: (dt, arr))
    )
)
def test_tensor_round_trip_hypothesis(data: tuple[torch.dtype, np.ndarray]) -> None:
    dtype, arr = data
    t = torch.from_numpy(arr.copy())
    assert t.dtype == dtype
    out = wire_round_trip(t)
    assert_same_tensor(t, out)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (2, 3), (2, 1, 4)], ids=str)
def test_tensor_round_trip_every_dtype(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        t = torch.randint(0, 2, shape, generator=gen).to(torch.bool)
    elif dtype.is_floating_point:
        t = (torch.randn(shape, generator=gen, dtype=torch.float64) * 100).to(dtype)
    else:
        info = torch.iinfo(dtype)
        t = torch.randint(max(info.min, -(2**62)), min(info.max, 2**62), shape, generator=gen, dtype=dtype)
    out = wire_round_trip(t)
    assert_same_tensor(t, out)
    if dtype == torch.bool:
        assert isinstance(encode_tensor(t), CBORTag) and encode_tensor(t).tag == BOOL_TAG
    assert t.dim() != 0 or out.dim() == 0  # a 0-d tensor stays 0-d, not shape (1,)


def test_tensor_extremes_and_layout() -> None:
    # Integer extremes, float specials, a non-contiguous view and a tensor that requires grad.
    ints = torch.tensor([torch.iinfo(torch.int64).min, -1, 0, torch.iinfo(torch.int64).max])
    assert_same_tensor(ints, wire_round_trip(ints))
    floats = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 1e-45], dtype=torch.float32)
    assert_same_tensor(floats, wire_round_trip(floats))
    view = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    assert not view.is_contiguous()
    assert torch.equal(wire_round_trip(view), view)
    leaf = torch.ones(2, 2, requires_grad=True)
    out = wire_round_trip(leaf)
    assert torch.equal(out, leaf.detach()) and not out.requires_grad
    # The decoded tensor owns writable memory (no read-only numpy buffer underneath).
    out += 1
    assert torch.equal(out, torch.full((2, 2), 2.0))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.bfloat16, torch.uint16], ids=str)
def test_encode_rejects_unsupported_dtype(dtype: torch.dtype) -> None:
    with pytest.raises(ProtocolError, match="dtype"):
        encode_tensor(torch.zeros(2, dtype=dtype))


def _tensor_item(shape: Any, tag: int, raw: Any) -> CBORTag:
    return CBORTag(MULTI_DIM_TAG, [shape, CBORTag(tag, raw)])


@pytest.mark.parametrize(
    "item",
    [
        pytest.param(_tensor_item([2, 2], 85, b"\x00" * 15), id="one-byte-short"),
        pytest.param(_tensor_item([2, 2], 85, b"\x00" * 17), id="one-byte-long"),
        pytest.param(_tensor_item([], 79, b"\x00" * 4), id="0d-int64-needs-8"),
        pytest.param(_tensor_item([0], 85, b"\x00"), id="empty-with-bytes"),
        pytest.param(_tensor_item([2**31], 64, b""), id="over-element-limit"),
    ],
)
def test_decode_tensor_rejects_wrong_byte_count(item: CBORTag) -> None:
    with pytest.raises(ProtocolError):
        decode_tensor(item)


@pytest.mark.parametrize(
    "shape",
    [[-1], [2, -3], ["2"], [1.0], None, 3, "23", {"a": 1}],
    ids=lambda s: repr(s),
)
def test_decode_tensor_rejects_bad_shape(shape: Any) -> None:
    with pytest.raises(ProtocolError, match="shape"):
        decode_tensor(_tensor_item(shape, 85, b"\x00" * 4))


@pytest.mark.parametrize(
    "typed",
    [
        pytest.param(CBORTag(81, b"\x00" * 4), id="float32-big-endian"),
        pytest.param(CBORTag(69, b"\x00" * 4), id="uint16-le"),
        pytest.param(CBORTag(87, b"\x00" * 16), id="float128-le"),
        pytest.param(CBORTag(12345, b"\x00" * 4), id="private-tag"),
        pytest.param(CBORTag(85, [0, 0, 0, 0]), id="list-instead-of-bytes"),
        pytest.param(CBORTag(85, "abcd"), id="text-instead-of-bytes"),
        pytest.param(b"\x00" * 4, id="untagged-bytes"),
    ],
)
def test_decode_tensor_rejects_unknown_typed_array(typed: Any) -> None:
    with pytest.raises(ProtocolError, match="typed array"):
        decode_tensor(CBORTag(MULTI_DIM_TAG, [[1], typed]))


@pytest.mark.parametrize(
    "item",
    [
        42,
        "tensor",
        None,
        b"\x00\x00\x00\x00",
        [[1], CBORTag(85, b"\x00" * 4)],
        CBORTag(41, [[1], CBORTag(85, b"\x00" * 4)]),
        CBORTag(MULTI_DIM_TAG, [[1]]),
        CBORTag(MULTI_DIM_TAG, [[1], CBORTag(85, b"\x00" * 4), 0]),
        CBORTag(MULTI_DIM_TAG, "not an array"),
        CBORTag(BOOL_TAG, 1),
        CBORTag(BOOL_TAG, CBORTag(BOOL_TAG, CBORTag(MULTI_DIM_TAG, [[1], CBORTag(64, b"\x01")]))),
    ],
    ids=repr,
)
def test_decode_tensor_rejects_non_tensors(item: Any) -> None:
    with pytest.raises(ProtocolError):
        decode_tensor(item)


@pytest.mark.parametrize(
    "shape",
    [[2**32, 2**32], [2**32, 2**32, 1], [0, 2**62, 2**62], [2**62, 2**62, 0], [2**70], [2**31, 0]],
    ids=str,
)
def test_decode_tensor_rejects_overflowing_shape(shape: list[int]) -> None:
    # A product that wraps around in 64 bits (or a zero-element tensor with absurd dimensions) must be
    # refused as a protocol error, not crash numpy.
    with pytest.raises(ProtocolError):
        decode_tensor(_tensor_item(shape, 85, b""))
