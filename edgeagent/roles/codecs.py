"""Which codecs a stage applies to what it sends, and undoing them on receipt (AccEPT Sec. 3.3-3.4).

The central node decides the bit widths (fixed, the paper's adaptive schedule, or ``auto`` from the
measured links) and tells every stage with ``run/command compression``; each stage compresses its
outgoing activations with the k-bit multi-bit quantizer and its outgoing gradients with stochastic
8- or 4-bit quantization. A compressed tensor travels as the codec's wire dict next to an empty
placeholder tensor, so every payload names its codec and parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from edgeagent.compression import CodecState, from_wire, get_codec, to_wire

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
    raw_bytes: int = 0
    sent_bytes: int = 0

    def set_bits(self, forward: int, backward: int) -> None:
        self.forward_bits, self.backward_bits = forward, backward

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.sent_bytes if self.sent_bytes else 1.0

    def _account(self, t: torch.Tensor, packed: dict[str, Any] | None) -> None:
        raw = t.numel() * t.element_size()
        self.raw_bytes += raw
        self.sent_bytes += len(packed["data"]) if packed is not None else raw

    def activation(self, x: torch.Tensor, *, epoch: int, train: bool = True) -> tuple[torch.Tensor, Any]:
        """``(tensor to send, compressed dict or None)``; evaluation batches leave the state alone."""
        if self.forward_bits >= NONE:
            self._account(x, None)
            return x, None
        if train:
            self.state.start_epoch(epoch)
        codec = get_codec(forward_codec_id(self.forward_bits))
        packed = to_wire(codec.compress(x, state=self.state if train else None))
        self._account(x, packed)
        return torch.empty(0), packed

    def gradient(self, g: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if self.backward_bits >= NONE:
            self._account(g, None)
            return g, None
        codec = get_codec(backward_codec_id(self.backward_bits))
        packed = to_wire(codec.compress(g, generator=self.generator))
        self._account(g, packed)
        return torch.empty(0), packed


def restore(t: torch.Tensor, packed: Any) -> torch.Tensor:
    """The tensor a message carries: itself, or its decompressed form. Raises ``CompressionError``."""
    if packed is None:
        return t
    wire = from_wire(packed)
    return get_codec(wire.codec).decompress(wire)
