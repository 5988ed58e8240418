"""Ours's trial of N in the first epoch (beyond the paper, which trusts its estimate; Sec. 3.3.3).

The estimate's N is where a flat curve is lowest: at 4G+ and WiFi it changed by 3-5 % from N = 8 to 22,
while the real exhaustive search found N = 13 and 5 fastest, 13-17 % faster than the estimate's pick
(``bench/splitfed.py --parts score``). What the estimate misses there (each mini-batch's cost on a busy,
emulated-slow device beyond its layers' profiled times) is cheap to measure: the first epoch runs each
device's N and smaller ones in turn, one per iteration, and the device reports every iteration's
seconds (``SplitUpdate.iteration_seconds``). Every iteration is real training (N only changes how a
batch is cut into mini-batches: one update per batch either way), so the trial costs the first epoch a
few slower iterations and no selection time. Pure: no torch, no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

__all__ = ["TRIAL_FACTORS", "candidates", "pick", "schedule"]

TRIAL_FACTORS: tuple[float, ...] = (1.0, 2 / 3, 1 / 2, 1 / 3)
"""The Ns tried, as shares of the estimate's: the estimate erred towards larger N (see the module note)."""

MARGIN = 0.03
"""A smaller N replaces the estimate's only if it measured at least this share faster."""


def candidates(n: int) -> list[int]:
    """The Ns tried for an estimate of ``n``: ``n`` first, then ``n`` x each factor, rounded, distinct."""
    if n < 1:
        raise ValueError(f"N must be >= 1, got {n}")
    out: list[int] = []
    for factor in TRIAL_FACTORS:
        m = max(1, round(n * factor))
        if m not in out:
            out.append(m)
    return out


def schedule(n: int, iterations: int) -> list[int]:
    """N of each of the first epoch's ``iterations``: the first at ``n`` (a round's first iteration is its
    slowest: not compared), then the candidates in turn. [] (no trial) when there is nothing to try or
    too few iterations to try every candidate once."""
    tried = candidates(n)
    if len(tried) < 2 or iterations < len(tried) + 1:
        return []
    return [n] + [tried[i % len(tried)] for i in range(iterations - 1)]


def pick(runs: Sequence[tuple[Sequence[int], Sequence[float]]], n: int, margin: float = MARGIN) -> int:
    """The N to keep from trial ``runs`` (each a device's schedule and its iterations' seconds; several
    for devices planned as one): the candidate with the lowest mean seconds per iteration over every
    run, not counting each run's first iteration; ``n`` unless that is at least ``margin`` faster than
    ``n``'s own (or ``n`` was not measured at all and it is simply the fastest)."""
    seconds: dict[int, list[float]] = {}
    for plan, times in runs:
        for m, t in list(zip(plan, times, strict=False))[1:]:
            seconds.setdefault(m, []).append(t)
    if not seconds:
        return n
    means: Mapping[int, float] = {m: statistics.mean(ts) for m, ts in seconds.items()}
    best = min(means, key=lambda m: (means[m], -m))
    if n in means and means[best] > (1.0 - margin) * means[n]:
        return n
    return best
