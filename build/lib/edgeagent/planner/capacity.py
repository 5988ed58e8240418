"""Computing capacity of a stage from its measured time (papers/000 Sec. III-D, eq. 1-3).

The central node profiles every layer once (``T^0_{e,j}``, forward+backward seconds per batch, see
:mod:`edgeagent.planner.profiler`). Each stage then reports its measured average seconds per batch
``T~_e^i``; the ratio of the two is the stage's capacity ``C_i`` (a slowdown factor: 1.0 runs like the
central node, 10.0 is ten times slower). The central node's own capacity ``C_0`` is 1.0 by default in
the paper; :func:`capacities` estimates it like any other stage, and callers may override it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from edgeagent.planner.partition import check_points


def range_sum(values: Sequence[float], start: int, end: int) -> float:
    """``sum(values[start:end])`` added left to right.

    One summation order everywhere in the planner, so that the DP and a brute force over the same
    numbers produce bit-identical stage times (``sum()`` uses compensated summation from Python 3.12).
    """
    total = 0.0
    for m in range(start, end):
        total += values[m]
    return total


def capacity(stage_time: float, layer_times: Sequence[float], start: int, end: int) -> float:
    """Eq. 1-2: ``C_i = T~_e^i / sum_{j=start}^{end-1} T^0_{e,j}`` over the half-open range ``[start, end)``.

    ``stage_time`` is the stage's measured average seconds per batch (forward+backward) and
    ``layer_times`` the central node's per-layer profile ``T^0_{e,j}``.
    """
    if not 0 <= start < end <= len(layer_times):
        raise ValueError(f"layer range [{start}, {end}) is empty or outside 0..{len(layer_times)}")
    if not (math.isfinite(stage_time) and stage_time >= 0):
        raise ValueError(f"stage time {stage_time} must be finite and >= 0")
    reference = range_sum(layer_times, start, end)
    if not (math.isfinite(reference) and reference > 0):
        raise ValueError(
            f"profiled time of layers [{start}, {end}) is {reference}; it must be finite and > 0 to "
            "estimate a capacity"
        )
    return stage_time / reference


def capacities(
    stage_times: Sequence[float], layer_times: Sequence[float], points: Sequence[int]
) -> list[float]:
    """Eq. 1-2 for every stage: ``stage_times[i]`` was measured while stage ``i`` owned
    ``[points[i], points[i+1])``. Returns one capacity per stage, stage 0 (the central node) included.
    """
    check_points(points, len(layer_times))
    if len(stage_times) != len(points) - 1:
        raise ValueError(
            f"{len(stage_times)} stage times for {len(points) - 1} stages (points {list(points)})"
        )
    return [capacity(t, layer_times, points[i], points[i + 1]) for i, t in enumerate(stage_times)]


def scaled_layer_times(layer_times: Sequence[float], capacity: float) -> list[float]:
    """Eq. 3: ``T^i_{e,j} = T^0_{e,j} * C_i``, the estimated per-layer time on a stage of capacity ``C_i``."""
    if not (math.isfinite(capacity) and capacity > 0):
        raise ValueError(f"capacity {capacity} must be finite and > 0")
    return [t * capacity for t in layer_times]
