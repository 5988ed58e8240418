"""Tensors on the wire as RFC 8746 typed arrays inside CBOR.

A tensor is ``Tag(40, [shape, Tag(<typed array>, raw little-endian bytes)])``: the RFC's row-major
multi-dimensional array around a typed array. No pickle is involved, so any CBOR decoder in any
language can read an activation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from cbor2 import CBORTag

from edgeagent.errors import ProtocolError

# RFC 8746 section 2.1: little-endian typed array tags.
_TAG_BY_DTYPE: dict[torch.dtype, int] = {
    torch.uint8: 64,
    torch.bool: 64,  # travels as uint8, restored by the ``b`` flag below
    torch.int8: 72,
    torch.int16: 77,
    torch.int32: 78,
    torch.int64: 79,
    torch.float16: 84,
    torch.float32: 85,
    torch.float64: 86,
}
_NUMPY_BY_TAG: dict[int, str] = {
    64: "<u1",
    72: "<i1",
    77: "<i2",
    78: "<i4",
    79: "<i8",
    84: "<f2",
    85: "<f4",
    86: "<f8",
}
MULTI_DIM_TAG = 40
BOOL_TAG = 40_000  # private tag around a uint8 array that holds booleans
MAX_TENSOR_ELEMENTS = 1 << 30


def encode_tensor(t: torch.Tensor) -> CBORTag:
    """Turn a CPU tensor into a CBOR item (a copy of its bytes, contiguous, little-endian)."""
    if t.dtype not in _TAG_BY_DTYPE:
        allowed = ", ".join(sorted(str(d) for d in _TAG_BY_DTYPE))
        raise ProtocolError(f"cannot send a tensor of dtype {t.dtype}; allowed: {allowed}")
    data = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bool:
        data = data.to(torch.uint8)
    raw = data.numpy().astype(_NUMPY_BY_TAG[_TAG_BY_DTYPE[t.dtype]], copy=False).tobytes()
    item = CBORTag(MULTI_DIM_TAG, [list(t.shape), CBORTag(_TAG_BY_DTYPE[t.dtype], raw)])
    return CBORTag(BOOL_TAG, item) if t.dtype == torch.bool else item


def decode_tensor(item: Any) -> torch.Tensor:
    """Inverse of :func:`encode_tensor`. Raises :class:`ProtocolError` on anything malformed."""
    is_bool = isinstance(item, CBORTag) and item.tag == BOOL_TAG
    if is_bool:
        item = item.value
    if not isinstance(item, CBORTag) or item.tag != MULTI_DIM_TAG:
        raise ProtocolError(f"expected a tensor (CBOR tag {MULTI_DIM_TAG}), got {type(item).__name__}")
    value = item.value
    # cbor2 decodes arrays inside tags as tuples
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ProtocolError("a tensor must be [shape, typed array]")
    shape, typed = value
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ProtocolError(f"bad tensor shape {shape!r}")
    if not isinstance(typed, CBORTag) or typed.tag not in _NUMPY_BY_TAG or not isinstance(typed.value, bytes):
        raise ProtocolError(f"unsupported typed array tag {getattr(typed, 'tag', None)!r}")
    dtype = np.dtype(_NUMPY_BY_TAG[typed.tag])
    count = math.prod(shape)  # Python ints: no silent 64-bit wrap-around for hostile shapes
    if count > MAX_TENSOR_ELEMENTS or any(d > MAX_TENSOR_ELEMENTS for d in shape):
        raise ProtocolError(f"tensor of {count} elements exceeds the limit of {MAX_TENSOR_ELEMENTS}")
    if len(typed.value) != count * dtype.itemsize:
        raise ProtocolError(
            f"tensor of shape {shape} needs {count * dtype.itemsize} bytes, got {len(typed.value)}"
        )
    try:
        arr = np.frombuffer(typed.value, dtype=dtype).reshape(tuple(shape))
    except ValueError as exc:
        raise ProtocolError(f"tensor of shape {list(shape)} cannot be built: {exc}") from exc
    out = torch.from_numpy(arr.astype(dtype.newbyteorder("="), copy=True))
    return out.to(torch.bool) if is_bool else out


def tensor_nbytes(t: torch.Tensor) -> int:
    """Bytes a tensor takes on the wire, without the few bytes of CBOR framing."""
    return t.numel() * t.element_size()
