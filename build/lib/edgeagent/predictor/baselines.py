"""The baselines AccEPT compares its predictor with (papers/004 Sec. 4.2.1), and its accuracy metric.

* FLOPs-linear: a sub-model's time is ``a * FLOPs + b``, fitted by least squares to the device's own
  measured points (its ten representative sub-models: the same information the predictor gets).
* Look-up table: the sum of the per-layer times measured on that device (single-layer sub-models).
* FTPipeHD's capacity ratio (papers/000 eq. 1-3): the central node's per-layer profile times the ratio of
  one measured sub-model (the device's stage under the equal split) to the same layers on the central node.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeagent.predictor.submodels import Range, range_flops, representative


def within(predicted: Sequence[float], measured: Sequence[float], bound: float) -> float:
    """Share of predictions within ``±bound`` (relative) of the measured times (the paper's ±5 %, ±10 %)."""
    if len(predicted) != len(measured) or not measured:
        raise ValueError(f"{len(predicted)} predictions for {len(measured)} measurements")
    hits = sum(abs(p - m) <= bound * m for p, m in zip(predicted, measured, strict=True))
    return hits / len(measured)


def flops_linear(layer_flops: Sequence[float], h: Sequence[float], ranges: Sequence[Range]) -> list[float]:
    """``a * FLOPs + b`` through the representative sub-models' (FLOPs, measured time) points."""
    reps = representative(layer_flops)
    x = np.array([range_flops(layer_flops, a, b) for a, b in reps])
    slope, intercept = np.polyfit(x, np.asarray(h, dtype=float), 1)
    return [float(slope * range_flops(layer_flops, a, b) + intercept) for a, b in ranges]


def lookup_table(layer_seconds: Sequence[float], ranges: Sequence[Range]) -> list[float]:
    """The sum of the device's measured per-layer times over each range."""
    return [float(sum(layer_seconds[a:b])) for a, b in ranges]


def capacity_ratio(
    reference_layers: Sequence[float], stage: Range, stage_seconds: float, ranges: Sequence[Range]
) -> list[float]:
    """FTPipeHD: ``C = T~(stage) / sum_{j in stage} T^0_j`` and every range ``sum T^0_j * C``."""
    a, b = stage
    reference = float(sum(reference_layers[a:b]))
    if reference <= 0:
        raise ValueError(f"the reference time of layers [{a}, {b}) is {reference}; it must be > 0")
    ratio = stage_seconds / reference
    return [float(sum(reference_layers[s:e])) * ratio for s, e in ranges]


__all__ = ["capacity_ratio", "flops_linear", "lookup_table", "within"]
