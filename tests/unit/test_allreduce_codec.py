"""The allreduce mode's link codec (edgeagent.allreduce.codec.py): the reduce direction is
compressed with the stochastic k-bit codec and decodes within one quantization step; the broadcast and
every other kind travel untouched; what a run does not send is refused."""

from __future__ import annotations

import pytest
import torch

from edgeagent.allreduce.codec import LinkCodec, gradient_bits
from edgeagent.compression.base import Compressed, CompressionError
from edgeagent.errors import ConfigError


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("kind", ["data_reduce", "data_reduce_request"])
def test_reduce_kinds_are_compressed_and_decode_within_one_step(bits: int, kind: str) -> None:
    codec = LinkCodec(bits, seed=1)
    g = torch.randn(1001, generator=torch.Generator().manual_seed(0))
    packed = codec.encode(kind, g)
    assert isinstance(packed, Compressed) and packed.codec == f"sq{bits}"
    decoded = codec.decode(kind, packed, 1001)
    assert decoded is not None and decoded.dtype == torch.float32 and decoded.shape == g.shape
    step = float(g.abs().max()) / ((1 << (bits - 1)) - 1)
    assert float((decoded - g).abs().max()) <= step * (1 + 1e-6)
    assert codec.raw_bytes == 1001 * 4
    assert codec.ratio > (3.5 if bits == 8 else 7.0)


@pytest.mark.parametrize("kind", ["data_bcast", "direct", "ps_grad", "ps_weights"])
def test_the_broadcast_and_other_kinds_travel_exact(kind: str) -> None:
    codec = LinkCodec(8)
    g = torch.randn(10)
    assert codec.encode(kind, g) is g
    assert codec.decode(kind, g, 10) is g
    assert codec.raw_bytes == 0 and codec.ratio == 1.0


def test_no_compression_leaves_everything_exact() -> None:
    codec = LinkCodec(None)
    g = torch.randn(10)
    assert codec.encode("data_reduce", g) is g and codec.decode("data_reduce", g, 10) is g
    assert codec.encode("data_reduce", None) is None


def test_what_the_run_does_not_send_is_refused() -> None:
    g = torch.randn(10)
    packed = LinkCodec(8).encode("data_reduce", g)
    assert isinstance(packed, Compressed)
    with pytest.raises(CompressionError, match="exact"):
        LinkCodec(8).decode("data_bcast", packed, 10)  # a compressed broadcast
    with pytest.raises(CompressionError, match="exact"):
        LinkCodec(None).decode("data_reduce", packed, 10)
    with pytest.raises(CompressionError, match="sq8, not sq4"):
        LinkCodec(4).decode("data_reduce", packed, 10)
    with pytest.raises(CompressionError, match="not compressed"):
        LinkCodec(8).decode("data_reduce", g, 10)
    with pytest.raises(CompressionError, match="<= 5"):
        LinkCodec(8).decode("data_reduce", packed, 5)


def test_only_none_8_and_4_are_allowed() -> None:
    assert [gradient_bits(v) for v in ("none", "8", "4")] == [None, 8, 4]
    for value in ("2", "3", "adaptive", "auto"):
        with pytest.raises(ConfigError, match="none, 8 or 4"):
            gradient_bits(value)
