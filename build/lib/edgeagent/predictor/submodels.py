"""Contiguous sub-models of an ``l``-layer model, their encodings and the representative ten (pure).

A sub-model is a half-open layer range ``[start, end)``; there are ``M = l(l+1)/2`` of them. The paper
(papers/004 Sec. 3.2) encodes one as a binary layer-presence vector ``s`` and characterises a device by
the measured times of ten representative sub-models: all ``M`` sorted by FLOPs, the ones at indices
``k(M-1)/9`` for ``k = 0..9`` (rounded down where ``(M-1)/9`` is not whole).
"""

from __future__ import annotations

from collections.abc import Sequence

Range = tuple[int, int]
REPRESENTATIVES = 10


def all_ranges(num_layers: int) -> list[Range]:
    """Every contiguous sub-model ``[start, end)``, by start then end: ``l(l+1)/2`` of them."""
    if num_layers < 1:
        raise ValueError(f"a model needs at least 1 layer, got {num_layers}")
    return [(s, e) for s in range(num_layers) for e in range(s + 1, num_layers + 1)]


def encode(start: int, end: int, num_layers: int) -> list[float]:
    """The paper's ``s``: 1.0 for each layer in ``[start, end)``, 0.0 elsewhere (length ``num_layers``)."""
    if not 0 <= start < end <= num_layers:
        raise ValueError(f"layer range [{start}, {end}) is empty or outside 0..{num_layers}")
    return [1.0 if start <= j < end else 0.0 for j in range(num_layers)]


def range_flops(layer_flops: Sequence[float], start: int, end: int) -> float:
    total = 0.0
    for j in range(start, end):
        total += layer_flops[j]
    return total


def by_flops(layer_flops: Sequence[float]) -> list[Range]:
    """All sub-models sorted by FLOPs (ties: by start, then end), the order the paper ranks them in."""
    ranges = all_ranges(len(layer_flops))
    return sorted(ranges, key=lambda r: (range_flops(layer_flops, *r), r))


def representative(layer_flops: Sequence[float], count: int = REPRESENTATIVES) -> list[Range]:
    """The ``count`` sub-models at FLOPs ranks ``k(M-1)/(count-1)``, ``k = 0..count-1`` (papers/004 Sec. 3.2).

    With fewer than ``count`` sub-models (a model of 1-3 layers) ranks repeat; the list keeps ``count``
    entries so that ``h`` always has the same length.
    """
    if count < 2:
        raise ValueError(f"need at least 2 representative sub-models, got {count}")
    ranked = by_flops(layer_flops)
    last = len(ranked) - 1
    return [ranked[k * last // (count - 1)] for k in range(count)]


__all__ = ["REPRESENTATIVES", "Range", "all_ranges", "by_flops", "encode", "range_flops", "representative"]
