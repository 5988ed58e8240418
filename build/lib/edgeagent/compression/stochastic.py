"""Stochastic uniform quantization of gradients to 8 or 4 bits (AccEPT Sec. 3.3 and 3.4).

Backward quantizer: with c = max|g| and L = 2^(k-1) - 1, the scale is s = c / L, so g / s lies in
[-L, L], and each value is rounded down or up at random, up with probability g/s - floor(g/s)
(eq. 7). The expectation of the rounded value is g/s exactly: rounding is unbiased, and small
gradients survive on average instead of always becoming zero as with nearest rounding.

Backward encoder: 8-bit values travel as int8 as they are. 4-bit values are shifted by 8 into
[0, 15] and two batch rows share a byte: with the tensor viewed as (n, M), byte [j, m] holds row
2j in its high nibble and row 2j + 1 in its low nibble, giving ceil(n/2) x M bytes in C order. An
odd n is padded with one row of zeros (nibble 8); the true shape in the payload drops it.

Decoder and dequantizer (Sec. 3.4): split the nibbles, subtract 8, multiply by s.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from edgeagent.compression.base import (
    DTYPES,
    Codec,
    CodecState,
    Compressed,
    CompressionError,
    Role,
    check_float,
    check_param_keys,
    float_tensor,
    numel,
    rows,
)

BITS = (8, 4)


def stochastic_round(y: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """floor(y + u) with u ~ U[0, 1): equals floor(y) + 1 with probability y - floor(y) (eq. 7)."""
    u = torch.rand(y.shape, generator=generator, dtype=y.dtype)
    return torch.floor(y + u)


class StochasticQuantizer(Codec):
    """k-bit backward codec (k in 8, 4; wire ids ``sq8``, ``sq4``) for gradients (Sec. 3.3).

    Randomness comes from the ``generator`` given to :meth:`compress` or else from a generator the
    codec owns, seeded with ``seed``. It never draws from torch's global generator, so turning
    compression on does not shift the random streams of dropout or data shuffling.
    """

    roles = frozenset({Role.GRADIENT})

    def __init__(self, bits: int, *, seed: int = 0) -> None:
        if bits not in BITS:
            raise ValueError(f"stochastic quantization supports bits in {BITS}, got {bits}")
        self.bits = bits
        self.levels = (1 << (bits - 1)) - 1  # L: values in [-L, L]
        self.wire_id = f"sq{bits}"
        self._generator = torch.Generator().manual_seed(seed)

    def compress(
        self,
        t: torch.Tensor,
        *,
        state: CodecState | None = None,
        generator: torch.Generator | None = None,
    ) -> Compressed:
        """Scale by max|g| / L, round stochastically, pack (``state`` is not used: no memory)."""
        x, dtype = float_tensor(t, wire_id=self.wire_id)
        shape = tuple(x.shape)
        n, m = rows(shape)
        peak = float(x.abs().max()) if x.numel() else 0.0
        scale = float(torch.tensor(peak / self.levels, dtype=torch.float32))  # what the receiver uses
        if scale == 0.0:
            # all zeros (or denormals that vanish in float32): every level is 0, no randomness needed
            q = torch.zeros(shape, dtype=torch.int8)
        else:
            y = x / scale  # (shape) in [-L, L] up to one rounding step
            gen = generator if generator is not None else self._generator
            # clamp only catches y = L + ulp rounding up; it cannot move an in-range value
            q = stochastic_round(y, gen).clamp_(-self.levels, self.levels).to(torch.int8)
        q_np = q.numpy().reshape(n, m)  # (n, M) int8
        if self.bits == 8:
            data = q_np.tobytes()
        else:
            nib = (q_np + 8).astype(np.uint8)  # (n, M) in [1, 15]
            if n % 2:
                nib = np.pad(nib, ((0, 1), (0, 0)), constant_values=8)  # a row of zeros
            data = ((nib[0::2] << 4) | nib[1::2]).tobytes()  # (ceil(n/2), M)
        return Compressed(self.wire_id, shape, dtype, {"scale": scale}, data)

    def decompress(self, c: Compressed) -> torch.Tensor:
        """ĝ = g_q * s (Sec. 3.4)."""
        self.validate(c)
        n, m = rows(c.shape)
        raw = np.frombuffer(c.data, dtype=np.uint8)
        if self.bits == 8:
            q = raw.view(np.int8).reshape(n, m)
        else:
            packed = raw.reshape((n + 1) // 2, m)
            nib = np.empty((packed.shape[0] * 2, m), dtype=np.uint8)  # (2 ceil(n/2), M)
            nib[0::2] = packed >> 4
            nib[1::2] = packed & 0x0F
            q = nib[:n].astype(np.int8) - np.int8(8)  # (n, M) in [-8, 7]
        g = torch.from_numpy(q.astype(np.float32)) * float(c.params["scale"])
        return g.reshape(c.shape).to(DTYPES[c.dtype])

    def data_nbytes(self, shape: tuple[int, ...], dtype: str = "float32") -> int:
        if self.bits == 8:
            return numel(shape)
        n, m = rows(shape)
        return (n + 1) // 2 * m

    def params_template(self) -> dict[str, Any]:
        return {"scale": 0.0}

    def check_params(self, c: Compressed) -> None:
        check_param_keys(c, {"scale"})
        if check_float("scale", c.params["scale"], wire_id=self.wire_id) < 0:
            raise CompressionError(f"{self.wire_id} scale must be >= 0, got {c.params['scale']}")
