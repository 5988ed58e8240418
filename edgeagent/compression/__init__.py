"""AccEPT's bit-level compression of pipeline traffic (paper 004, Sec. 3.3 and 3.4).

Activations go forward through :class:`MultiBitQuantizer` (``mbq2``..``mbq4``), gradients backward
through :class:`StochasticQuantizer` (``sq8``, ``sq4``); :class:`Identity` (``none``) sends
tensors as they are. A sender picks a codec by role and bit width (:class:`BitSchedule`,
:func:`auto_bits`, :func:`wire_id_for`), a receiver by the wire id the payload names
(:func:`get_codec`). Everything here is pure; the roles move the bytes.
"""

from __future__ import annotations

import functools

from edgeagent.compression.base import (
    Codec,
    CodecState,
    Compressed,
    CompressionError,
    Identity,
    Role,
    from_wire,
    get_codec,
    known_codecs,
    register,
    to_wire,
)
from edgeagent.compression.multibit import MultiBitQuantizer
from edgeagent.compression.schedule import (
    NO_COMPRESSION,
    BitSchedule,
    adaptive_for,
    adaptive_schedule,
    auto_bits,
    link_bits,
    wire_id_for,
)
from edgeagent.compression.stochastic import StochasticQuantizer

__all__ = [
    "NO_COMPRESSION",
    "BitSchedule",
    "Codec",
    "CodecState",
    "Compressed",
    "CompressionError",
    "Identity",
    "MultiBitQuantizer",
    "Role",
    "StochasticQuantizer",
    "adaptive_for",
    "adaptive_schedule",
    "auto_bits",
    "from_wire",
    "get_codec",
    "known_codecs",
    "link_bits",
    "register",
    "to_wire",
    "wire_id_for",
]

# The built-in codecs, one factory per wire id. This runs once, before any submodule is usable
# (importing edgeagent.compression.base imports this package first).
if "none" not in known_codecs():
    register(Identity)
    for _k in (2, 3, 4):
        register(functools.partial(MultiBitQuantizer, _k))
    for _bits in (8, 4):
        register(functools.partial(StochasticQuantizer, _bits))
