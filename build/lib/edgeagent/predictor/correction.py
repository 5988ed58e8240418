"""A device's per-layer correction of the predictor from a few measured sub-models (pure).

The pre-trained predictor sees a device only through ``h``: ten sub-models chosen by FLOPs rank, mostly
long ranges. What it cannot see are single layers that run faster or slower on this device than on the
devices it was trained on (seen on a machine unseen in training: layers 5-7 of MobileNetV2 predicted
13-48 % too slow under one thread and 21-24 % too fast under two). Retraining the network on eight more
samples (the paper's adaptive update) barely moves it: the samples are eight among thousands.

The correction is a Bayesian linear model on top of the prediction, one log factor ``delta_j`` per layer
with a zero-mean prior: a sub-model ``[a, b)``'s log error is the share-weighted mean of its layers'
factors, ``log(measured / predicted) = sum_j w_j delta_j`` with ``w_j`` layer ``j``'s share of the
range's predicted time. The ridge solution ``delta = X^T (X X^T + ridge I)^-1 y`` (``ridge`` = noise
variance over prior variance) moves only the layers the samples cover, by as much as they agree.

The samples that inform it most are a *tiling*: ``count`` contiguous ranges that cover the model once
(:func:`tiling`), so every layer is in exactly one sample; measuring all of them costs one forward and
backward pass of the whole model. The worker measures the tiling with ``h`` when it joins. A tile holds
layers of one kind where it can (the layers that take the same input shape: one resolution and width,
the same kernels), because a CPU of another kind speeds up or slows down a kind of layer, and the
correction spreads a tile's error over its layers alike. :func:`even_tiling` (ranges of about equal
layer count) is the first design, kept to compare.

The correction assumes a range's time is close to the sum of its layers' as the predictor has them.
:func:`additive` assumes instead that the measured tiles add up: a range is the sum, over the tiles it
meets, of the tile's measured time times the predicted share of the part of the tile inside the range
(like the look-up table, with tiles for layers). Which holds better differs by device (two threads with
small per-layer calls: the predictor's; a CPU of another kind: the tiles'), and the device's ``h`` says
which: :func:`blend` weighs the two in log space by how well each predicts the representatives that are
not tiles (:func:`blended`, ``--correction blend``).

:class:`TileFit` (``--correction linear``, the default since 2026-11-28) takes the tiles and the
representatives together as data for a linear model of the device: a sub-model's time is a fixed
``overhead`` per sub-model plus, per tile, the tile's own speed ``scales[k]`` times the predictor's
single-layer times of the sub-model's layers in that tile. The overhead is what makes a range cheaper
than its layers run one by one (a call, the autograd graph, the input copy: a CPU of another kind pays
it differently, which neither the per-layer factors nor the tiles added up could express); the predictor
only shares a tile out among its layers. On the CPU kinds outside pre-training it is right more often
than the blend and than the look-up table (docs/design.md, "The tiles and h in one linear fit").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from edgeagent.predictor.submodels import Range

TILES = 8  # the paper's adaptive update converges after eight samples (papers/004 Fig. 8)
# Noise variance over prior variance. Chosen on the training machine's held-out configurations among
# 0.03, 0.1, 0.3 and 1 (95.6, 95.6, 95.2, 94.5 % within ±10 %; the larger of the two ties), not on the
# unseen machine's, which is the test.
RIDGE = 0.1
# The blend's weights tried, from the additive tiles (0) to the correction (1).
BLEND_STEPS = tuple(i / 10 for i in range(11))
# TileFit's ridge on the tiles' speeds (towards their common speed, in squared relative error). Chosen on
# the training machine's held-out configurations among 0.1, 0.2, 0.3 and 0.5 (96.9, 97.3, 97.2, 96.9 %
# within ±10 %), not on the other machines' sets.
FIT_RIDGE = 0.2


def tiling(kinds: Sequence[Hashable], costs: Sequence[float], count: int = TILES) -> list[Range]:
    """``count`` contiguous ranges covering the layers once (fewer when there are fewer layers), each of
    one kind of layer where it can: the runs of consecutive layers of equal ``kinds`` (e.g. their input
    shapes); while there are more than ``count``, the adjacent pair of least summed ``costs`` (e.g.
    FLOPs) is merged, the earlier pair on a tie; while there are fewer, the run with the most layers is
    split in the middle (the earlier one on a tie)."""
    n = len(kinds)
    if n < 1 or count < 1 or len(costs) != n:
        raise ValueError(f"a tiling needs >= 1 layer, a cost per layer and >= 1 tile, got {n} layers, "
                         f"{len(costs)} costs, {count} tiles")  # fmt: skip
    cuts = [0, *(j for j in range(1, n) if kinds[j] != kinds[j - 1]), n]
    tiles = list(itertools.pairwise(cuts))
    while len(tiles) > count:
        merged = [sum(costs[tiles[i][0] : tiles[i + 1][1]]) for i in range(len(tiles) - 1)]
        i = min(range(len(merged)), key=merged.__getitem__)
        tiles[i : i + 2] = [(tiles[i][0], tiles[i + 1][1])]
    while len(tiles) < min(count, n):
        i = max(range(len(tiles)), key=lambda k: tiles[k][1] - tiles[k][0])
        a, b = tiles[i]
        tiles[i : i + 1] = [(a, (a + b) // 2), ((a + b) // 2, b)]
    return tiles


def even_tiling(num_layers: int, count: int = TILES) -> list[Range]:
    """``count`` contiguous ranges of about equal layer count covering ``[0, num_layers)`` once (fewer when
    the model has fewer layers): ``[round(i l / count), round((i + 1) l / count))``."""
    if num_layers < 1 or count < 1:
        raise ValueError(f"a tiling needs >= 1 layer and >= 1 tile, got {num_layers} layers, {count} tiles")
    count = min(count, num_layers)
    points = [round(i * num_layers / count) for i in range(count + 1)]
    return [(a, b) for a, b in itertools.pairwise(points) if b > a]


def _weights(layer_times: Sequence[float], start: int, end: int) -> np.ndarray:
    w = np.zeros(len(layer_times))
    part = np.asarray(layer_times[start:end], dtype=float)
    w[start:end] = part / part.sum()
    return w


@dataclass(frozen=True)
class Correction:
    """Per-layer log factors over a device's predicted times; :meth:`factor` of a range multiplies its
    prediction. ``Correction.none(l)`` changes nothing."""

    layer_times: tuple[float, ...]  # the predictor's single-layer times on the device (the weights)
    delta: tuple[float, ...]

    @classmethod
    def none(cls, layer_times: Sequence[float]) -> Correction:
        return cls(tuple(float(t) for t in layer_times), (0.0,) * len(layer_times))

    @classmethod
    def fit(
        cls,
        layer_times: Sequence[float],
        samples: Sequence[tuple[Range, float, float]],
        *,
        ridge: float = RIDGE,
    ) -> Correction:
        """From ``(range, predicted seconds, measured seconds)`` samples on one device; samples that are
        not finite positive times inside the model are left out (the others still count)."""
        times = tuple(float(t) for t in layer_times)
        n = len(times)
        if not times or not all(math.isfinite(t) and t > 0 for t in times):
            raise ValueError(f"layer times must be finite seconds > 0, got {list(times)}")
        if not (math.isfinite(ridge) and ridge > 0):
            raise ValueError(f"ridge must be a finite number > 0, got {ridge}")
        rows, errors = [], []
        for (a, b), predicted, measured in samples:
            ok = 0 <= a < b <= n and all(math.isfinite(v) and v > 0 for v in (predicted, measured))
            if ok:
                rows.append(_weights(times, a, b))
                errors.append(math.log(measured / predicted))
        if not rows:
            return cls.none(times)
        x, y = np.stack(rows), np.asarray(errors)
        delta = x.T @ np.linalg.solve(x @ x.T + ridge * np.eye(len(y)), y)
        return cls(times, tuple(float(d) for d in delta))

    def factor(self, start: int, end: int) -> float:
        """What the prediction of ``[start, end)`` is multiplied by."""
        return math.exp(float(_weights(self.layer_times, start, end) @ np.asarray(self.delta)))

    def apply(self, table: Sequence[Sequence[float]]) -> list[list[float]]:
        """A corrected copy of a predictor table (``table[s][e - s - 1]``: seconds of ``[s, e)``)."""
        if not any(self.delta):
            return [list(row) for row in table]
        return [[t * self.factor(s, s + 1 + k) for k, t in enumerate(row)] for s, row in enumerate(table)]


Table = list[list[float]]  # table[s][e - s - 1]: seconds of [s, e)


def per_layer(
    table: Sequence[Sequence[float]],
    tiles: Sequence[Range],
    seconds: Sequence[float],
    *,
    ridge: float = RIDGE,
) -> Table:
    """The predicted ``table`` corrected by :class:`Correction` fitted on the measured ``tiles``."""
    samples = [((a, b), table[a][b - a - 1], t) for (a, b), t in zip(tiles, seconds, strict=True)]
    return Correction.fit([row[0] for row in table], samples, ridge=ridge).apply(table)


def _check_tiling(tiles: Sequence[Range], seconds: Sequence[float], n: int) -> None:
    if len(tiles) != len(seconds):
        raise ValueError(f"{len(tiles)} tiles with {len(seconds)} times: a tiling needs one time per tile")
    points = [0, *(b for _, b in tiles)]
    if not tiles or [a for a, _ in tiles] != points[:-1] or points[-1] != n or any(a >= b for a, b in tiles):
        raise ValueError(f"the tiles {list(tiles)} do not cover the {n} layers of the table once, in order")


def additive(table: Sequence[Sequence[float]], tiles: Sequence[Range], seconds: Sequence[float]) -> Table:
    """Every range as the sum, over the ``tiles`` it meets (a tiling: contiguous, covering the model once),
    of the tile's measured ``seconds`` times the part's share of the tile in the predicted ``table``."""
    n = len(table)
    _check_tiling(tiles, seconds, n)
    of = [i for i, (a, b) in enumerate(tiles) for _ in range(a, b)]  # each layer's tile

    def range_seconds(s: int, e: int) -> float:
        total = 0.0
        for i in range(of[s], of[e - 1] + 1):
            a, b = tiles[i]
            lo, hi = max(s, a), min(e, b)
            total += seconds[i] * table[lo][hi - lo - 1] / table[a][b - a - 1]
        return total

    return [[range_seconds(s, e) for e in range(s + 1, n + 1)] for s in range(n)]


def blend(corrected: Sequence[float], tiled: Sequence[float], measured: Sequence[float]) -> float:
    """The weight ``w`` (of :data:`BLEND_STEPS`, the first on a tie) for which ``corrected^w tiled^(1-w)``
    has the least mean absolute log error against ``measured`` (1: no times to judge by)."""
    rows = [
        (math.log(c), math.log(t), math.log(m))
        for c, t, m in zip(corrected, tiled, measured, strict=True)
        if all(math.isfinite(v) and v > 0 for v in (c, t, m))
    ]
    if not rows:
        return 1.0
    return min(BLEND_STEPS, key=lambda w: sum(abs(w * c + (1 - w) * t - m) for c, t, m in rows))


def blended(
    table: Sequence[Sequence[float]],
    tiles: Sequence[Range],
    seconds: Sequence[float],
    judges: Sequence[tuple[Range, float]],
    *,
    ridge: float = RIDGE,
) -> tuple[Table, float]:
    """The predicted ``table`` corrected from the measured ``tiles`` (:class:`Correction`) and
    :func:`additive`, blended by the weight that fits the measured ``judges`` best (ranges other than
    the tiles: the device's representatives); returns the table and the weight."""
    corrected = per_layer(table, tiles, seconds, ridge=ridge)
    tiled = additive(table, tiles, seconds)
    used = set(tiles)
    judged = [((a, b), t) for (a, b), t in judges if (a, b) not in used and 0 <= a < b <= len(table)]
    w = blend(
        [corrected[a][b - a - 1] for (a, b), _ in judged],
        [tiled[a][b - a - 1] for (a, b), _ in judged],
        [t for _, t in judged],
    )
    mixed = [
        [c**w * t ** (1 - w) for c, t in zip(crow, trow, strict=True)]
        for crow, trow in zip(corrected, tiled, strict=True)
    ]
    return mixed, w


def _positive(*values: float) -> bool:
    return all(math.isfinite(v) and v > 0 for v in values)


@dataclass(frozen=True)
class TileFit:
    """A device's sub-model ``[a, b)`` takes ``overhead + sum_k scales[k] * P_k(a, b)`` seconds, ``P_k`` the
    predictor's single-layer ``layer_times`` of the range's layers in tile ``k``."""

    tiles: tuple[Range, ...]
    layer_times: tuple[float, ...]
    overhead: float  # seconds per sub-model, >= 0
    scales: tuple[float, ...]  # per tile, > 0

    @classmethod
    def fit(
        cls,
        layer_times: Sequence[float],
        tiles: Sequence[Range],
        seconds: Sequence[float],
        judges: Sequence[tuple[Range, float]] = (),
        *,
        ridge: float = FIT_RIDGE,
    ) -> TileFit:
        """Least squares of the relative error over the measured ``tiles`` (a tiling, one time each) and
        ``judges`` (other measured ranges: the device's representatives; a tile again, a range outside the
        model or a time that is not a finite positive number is left out), each tile's speed pulled towards
        their common speed by ``ridge``. The overhead is never negative (fitted as zero when it would be);
        should a tile's speed come out zero or less (judges that contradict the tiles), the tiles alone are
        taken as measured: no overhead, each tile's speed its time over its layers' predicted times."""
        times = tuple(float(t) for t in layer_times)
        n = len(times)
        if not times or not _positive(*times):
            raise ValueError(f"layer times must be finite seconds > 0, got {list(times)}")
        if not (math.isfinite(ridge) and ridge >= 0):
            raise ValueError(f"ridge must be a finite number >= 0, got {ridge}")
        _check_tiling(tiles, seconds, n)
        if not _positive(*seconds):
            raise ValueError(f"tile times must be finite seconds > 0, got {list(seconds)}")
        parts = [(tuple(t), float(s)) for t, s in zip(tiles, seconds, strict=True)]
        seen = {r for r, _ in parts}
        for (a, b), t in judges:
            if (a, b) not in seen and 0 <= a < b <= n and _positive(t):
                seen.add((a, b))
                parts.append(((a, b), float(t)))
        plain = cls(tuple((a, b) for a, b in tiles), times, 0.0, (1.0,) * len(tiles))
        x = np.array([plain._row(a, b) for (a, b), _ in parts])
        y = np.array([t for _, t in parts])
        common = float(y.sum() / x[:, 1:].sum())
        beta = _relative_ridge(x, y, ridge, common)
        if beta[0] < 0:
            beta = np.concatenate([[0.0], _relative_ridge(x[:, 1:], y, ridge, common, free=0)])
        if not (beta[1:] > 0).all():
            own = [t / sum(times[a:b]) for (a, b), t in zip(tiles, seconds, strict=True)]
            return cls(plain.tiles, times, 0.0, tuple(own))
        return cls(plain.tiles, times, float(beta[0]), tuple(float(v) for v in beta[1:]))

    def _row(self, start: int, end: int) -> list[float]:
        """``[1, P_1, ..., P_K]`` of the range ``[start, end)``."""
        return [1.0] + [sum(self.layer_times[max(start, a) : min(end, b)]) for a, b in self.tiles]

    def seconds(self, start: int, end: int) -> float:
        """The fitted time of ``[start, end)``."""
        return float(np.dot(self._row(start, end), (self.overhead, *self.scales)))

    def table(self) -> Table:
        """``table[s][e - s - 1]``: the fitted seconds of every range (running sums, O(l^2))."""
        n = len(self.layer_times)
        of = [k for k, (a, b) in enumerate(self.tiles) for _ in range(a, b)]
        out: Table = []
        for s in range(n):
            row, total = [], self.overhead
            for e in range(s + 1, n + 1):
                total += self.scales[of[e - 1]] * self.layer_times[e - 1]
                row.append(total)
            out.append(row)
        return out


def _relative_ridge(x: np.ndarray, y: np.ndarray, ridge: float, common: float, free: int = 1) -> np.ndarray:
    """``beta`` minimising ``sum ((x beta - y) / y)^2 + ridge * sum_{k >= free} (beta_k - common)^2``: the
    first ``free`` coefficients (the overhead) unpenalised."""
    xw = x / y[:, None]
    k = x.shape[1]
    penalty = np.diag([0.0] * free + [ridge] * (k - free))
    target = np.array([0.0] * free + [common] * (k - free))
    return np.linalg.lstsq(xw.T @ xw + penalty, xw.T @ np.ones(len(y)) + penalty @ target, rcond=None)[0]


def fitted(
    table: Sequence[Sequence[float]],
    tiles: Sequence[Range],
    seconds: Sequence[float],
    judges: Sequence[tuple[Range, float]],
    *,
    ridge: float = FIT_RIDGE,
) -> tuple[Table, TileFit]:
    """The device's table from :class:`TileFit` on the measured ``tiles`` and ``judges`` (the
    representatives), the shares within a tile the predicted ``table``'s single layers; and the fit."""
    fit = TileFit.fit([row[0] for row in table], tiles, seconds, judges, ridge=ridge)
    return fit.table(), fit


__all__ = [
    "BLEND_STEPS",
    "FIT_RIDGE",
    "RIDGE",
    "TILES",
    "Correction",
    "Table",
    "TileFit",
    "additive",
    "blend",
    "blended",
    "even_tiling",
    "fitted",
    "per_layer",
    "tiling",
]
