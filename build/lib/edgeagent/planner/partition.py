"""Partition points.

``points`` has ``n + 1`` entries: stage ``i`` owns layers ``[points[i], points[i+1])``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def check_points(points: Sequence[int], num_layers: int) -> None:
    if len(points) < 2 or points[0] != 0 or points[-1] != num_layers:
        raise ValueError(f"partition points {list(points)} must run from 0 to {num_layers}")
    if any(b <= a for a, b in itertools.pairwise(points)):
        raise ValueError(f"partition points {list(points)} must increase: every stage needs a layer")


def stage_of_layer(points: Sequence[int], layer: int) -> int:
    for i in range(len(points) - 1):
        if points[i] <= layer < points[i + 1]:
            return i
    raise ValueError(f"layer {layer} is outside the partition {list(points)}")


def balanced_partition(costs: Sequence[float], num_stages: int) -> list[int]:
    """Split layers into ``num_stages`` contiguous stages minimising the largest stage cost.

    All devices are taken as equal and communication as free: PipeDream's initial split, which
    FTPipeHD uses before it knows the devices (papers/000 Sec. III-B).
    """
    n_layers = len(costs)
    if not 1 <= num_stages <= n_layers:
        raise ValueError(f"cannot split {n_layers} layers into {num_stages} stages (need 1..{n_layers})")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][j]: the smallest possible largest-stage cost for layers [0, j) on k stages.
    best = [[inf] * (n_layers + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n_layers + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for j in range(k, n_layers + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], prefix[j] - prefix[i])
                # Ties go to the later cut so that earlier stages (which stash more versions) get less.
                if value <= best[k][j]:
                    best[k][j], cut[k][j] = value, i
    points = [n_layers]
    for k in range(num_stages, 0, -1):
        points.append(cut[k][points[-1]])
    points.reverse()
    check_points(points, n_layers)
    return points
