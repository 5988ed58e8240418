"""Compression of the allreduce mode's link messages (``--mode allreduce --compression 8|4``): AccEPT's
stochastic k-bit gradient codec (papers/004 Sec. 3.3-3.4, :mod:`edgeagent.compression.stochastic`)
applied by the mode's driver (the allreduce mode's worker session), so the collectives never see it: a
message's data is encoded just before it is published and decoded as soon as it arrives.

Only the reduce direction is compressed: ``data_reduce`` (a subtree's sum in the trees, a reduce-scatter
chunk in the ring) and ``data_reduce_request`` (a sum sent to a backup node for it to relay; the relay
decodes it and encodes it again, so a relayed sum is rounded twice). The broadcast (``data_bcast``: the
trees' mean, the ring's allgather chunks) stays exact: every replica must apply the same bits, and a
stochastic rounding per receiver would make the replicas drift apart. ``direct`` (each device averages
everyone's gradient itself) and the parameter server's messages are not compressed either: a device's own
gradient would be exact where the others' were rounded, and the replicas would differ.

Rounding is unbiased, so the mean is right in expectation; its error per value is below one step,
``max|sum| / (2^(k-1) - 1)``, per message.
"""

from __future__ import annotations

import torch

from edgeagent.compression.base import Compressed, CompressionError
from edgeagent.compression.stage import finite
from edgeagent.compression.stochastic import StochasticQuantizer
from edgeagent.errors import ConfigError

ALLOWED = ("none", "8", "4")
"""``--compression`` values of the allreduce mode: none, or k-bit stochastic gradients."""

REDUCE_KINDS = frozenset({"data_reduce", "data_reduce_request"})
"""The kinds whose data is compressed (the reduce direction); all others travel exact."""


def gradient_bits(value: str) -> int | None:
    """The bits of ``--compression value`` in the allreduce mode (None: no compression)."""
    if value not in ALLOWED:
        raise ConfigError(
            f"--mode allreduce compresses gradients with --compression none, 8 or 4 (bits); got {value!r}"
        )
    return None if value == "none" else int(value)


class LinkCodec:
    """Encodes and decodes one device's reduce-direction messages, and counts the bytes it saved."""

    def __init__(self, bits: int | None, *, seed: int = 0) -> None:
        self.codec = None if bits is None else StochasticQuantizer(bits, seed=seed)
        self.raw_bytes = 0  # float32 bytes of the tensors it encoded
        self.sent_bytes = 0  # their encoded bytes (the codec's parameters in)

    @property
    def ratio(self) -> float:
        """Uncompressed / sent bytes of the encoded tensors (1.0 before any)."""
        return self.raw_bytes / self.sent_bytes if self.sent_bytes else 1.0

    def encode(self, kind: str, data: torch.Tensor | None) -> torch.Tensor | Compressed | None:
        """``data`` as it goes on the wire: compressed if this is a reduce-direction message."""
        if self.codec is None or data is None or kind not in REDUCE_KINDS:
            return data
        packed = self.codec.compress(data)
        self.raw_bytes += data.numel() * 4
        self.sent_bytes += packed.nbytes()  # the scale in
        return packed

    def decode(self, kind: str, data: torch.Tensor | Compressed | None, limit: int) -> torch.Tensor | None:
        """The tensor of a received message; :class:`CompressionError` if it is not what this run sends
        (a compressed broadcast, a compressed message in an uncompressed run, another codec, not a flat
        float32 vector of at most ``limit`` values)."""
        if not isinstance(data, Compressed):
            if data is not None and self.codec is not None and kind in REDUCE_KINDS:
                raise CompressionError(f"{kind} not compressed in a {self.codec.wire_id} run")
            return data
        if self.codec is None or kind not in REDUCE_KINDS:
            raise CompressionError(f"{kind} compressed with {data.codec}; this run sends it exact")
        if data.codec != self.codec.wire_id:
            raise CompressionError(f"{kind} compressed with {data.codec}, not {self.codec.wire_id}")
        if len(data.shape) != 1 or not 0 <= data.shape[0] <= limit or data.dtype != "float32":
            raise CompressionError(f"{kind} of shape {data.shape} {data.dtype}: not <= {limit} float32")
        return finite(self.codec.decompress(data))


__all__ = ["ALLOWED", "REDUCE_KINDS", "LinkCodec", "gradient_bits"]
