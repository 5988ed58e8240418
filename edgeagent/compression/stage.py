"""Which codecs a stage applies to what it sends, and undoing them on receipt (AccEPT Sec. 3.3-3.4).

The central node decides the bit widths (fixed, the paper's adaptive schedule, or ``auto`` from the
measured links) and tells every stage with ``run/command compression``; each stage compresses its
outgoing activations with the k-bit multi-bit quantizer and its outgoing gradients with stochastic
8- or 4-bit quantization. A message's tensor field is either the raw tensor or the codec's
:class:`~edgeagent.compression.Compressed` (its wire dict names the codec and its parameters), decoded
and checked by the protocol layer; :func:`restore` turns it back into a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import cbor2
import torch

from edgeagent.compression import CodecState, Compressed, CompressionError, get_codec, to_wire
from edgeagent.compression.base import all_finite

NONE = 32  # "bits" meaning: no compression


def forward_codec_id(bits: int) -> str:
    return "none" if bits >= NONE else f"mbq{bits}"


def backward_codec_id(bits: int) -> str:
    return "none" if bits >= NONE else f"sq{bits}"


@dataclass
class StageCodecs:
    """One stage's outgoing codecs and the sender-side state of the forward quantizer."""

    forward_bits: int = NONE
    backward_bits: int = NONE
    state: CodecState = field(default_factory=CodecState)
    generator: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))
    raw_bytes: int = 0  # tensors as float32
    sent_bytes: int = 0  # the same tensors as sent: codes and the codec's parameters
    message_bytes: int = 0  # whole messages as sent (envelope, header fields, tensors)
    message_raw_bytes: int = 0  # what the same messages would have taken uncompressed
    _pending: int = 0  # bytes the last tensor would add to its message uncompressed

    def set_bits(self, forward: int, backward: int) -> None:
        self.forward_bits, self.backward_bits = forward, backward

    @property
    def ratio(self) -> float:
        """Uncompressed / sent bytes of whole messages, envelope included (what the link carries)."""
        if self.message_bytes:
            return self.message_raw_bytes / self.message_bytes
        return self.tensor_ratio

    @property
    def tensor_ratio(self) -> float:
        """Raw / sent bytes of the tensors alone (the codec's parameters count on the sent side)."""
        return self.raw_bytes / self.sent_bytes if self.sent_bytes else 1.0

    def _account(self, t: torch.Tensor, packed: dict[str, Any] | None) -> None:
        raw = t.numel() * t.element_size()
        self.raw_bytes += raw
        if packed is None:
            self.sent_bytes += raw
            self._pending = 0
            return
        header = cbor2.dumps({k: v for k, v in packed.items() if k != "data"})
        wire = len(packed["data"]) + len(header)
        self.sent_bytes += wire
        self._pending = raw - wire

    def message_sent(self, payload_bytes: int) -> None:
        """Count the message that carried the last tensor (``payload_bytes`` as encoded)."""
        self.message_bytes += payload_bytes
        self.message_raw_bytes += payload_bytes + self._pending
        self._pending = 0

    def activation(self, x: torch.Tensor, *, epoch: int, train: bool = True) -> torch.Tensor | Compressed:
        """What to send for an activation: ``x`` or its compressed form; evaluation batches leave the
        forward quantizer's state alone."""
        if self.forward_bits >= NONE:
            self._account(x, None)
            return x
        if train:
            self.state.start_epoch(epoch)
        codec = get_codec(forward_codec_id(self.forward_bits))
        packed = codec.compress(x, state=self.state if train else None)
        self._account(x, to_wire(packed))
        return packed

    def gradient(self, g: torch.Tensor) -> torch.Tensor | Compressed:
        """What to send for a gradient: ``g`` or its compressed form."""
        if self.backward_bits >= NONE:
            self._account(g, None)
            return g
        codec = get_codec(backward_codec_id(self.backward_bits))
        packed = codec.compress(g, generator=self.generator)
        self._account(g, to_wire(packed))
        return packed


def restore(value: torch.Tensor | Compressed) -> torch.Tensor:
    """The tensor a message carries: itself, or its decompressed form. Raises ``CompressionError``, also
    for a decompressed tensor that is not finite (finite parameters can still overflow: a scale near
    float32's largest value times a code; the raw tensors were checked at intake, see ``Role``)."""
    if isinstance(value, Compressed):
        return finite(get_codec(value.codec).decompress(value))
    return value


def finite(t: torch.Tensor) -> torch.Tensor:
    """``t`` if every value is finite, else :class:`CompressionError`."""
    if not all_finite(t):
        raise CompressionError(f"decompressed {tuple(t.shape)} tensor holds values that are not finite")
    return t
