"""Dynamic prediction and adaptive update during a run (papers/004 Sec. 3.2), as policy without I/O.

The central node keeps one :class:`DeviceTimes`: every device's ``h`` (from its announcement), the
predicted seconds of every contiguous layer range on it (the DP's tables, eq. 10; unless ``correction`` is
``none``, corrected by the tiling the device measured with its ``h``, :mod:`.correction`), and the measured
stage times that ride with the gradients. :meth:`DeviceTimes.observe` compares a measured time with the
prediction: beyond ``epsilon`` (relative) the device's computing resources changed and its ``h`` should
be measured again (the caller asks the device). Every observation is also a sample of ``D^``;
:meth:`DeviceTimes.adapt` continues training the predictor on them (the paper's continuous learning).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from edgeagent.predictor.correction import TileFit, blended, even_tiling, fitted, per_layer
from edgeagent.predictor.net import LatencyPredictor, Sample
from edgeagent.predictor.submodels import REPRESENTATIVES, Range, representative


@dataclass(frozen=True)
class Drift:
    """A measured stage time beyond ``epsilon`` of its prediction."""

    device: str
    start: int
    end: int
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return (self.measured - self.predicted) / self.predicted

    @property
    def recoverable(self) -> float:
        """The share of the run's time left that a new split can save at most: the gap over the larger of
        the two times (a stage 21 % slower than predicted: 17 %; 4x slower: 75 %)."""
        return abs(self.measured - self.predicted) / max(self.measured, self.predicted)


def valid_h(h: Sequence[float]) -> bool:
    return len(h) == REPRESENTATIVES and all(math.isfinite(v) and v > 0 for v in h)


DriftRule = Literal["paper", "changed", "rescale"]
# Under rule changed, a standing gap is rescaled when the stage time is at least this many times the
# prediction, or at most its inverse (DeviceTimes._gross).
GROSS_GAP = 2.0
DRIFT_RULES: tuple[DriftRule, ...] = ("paper", "changed", "rescale")
# How the tiles a device measured with its h correct its predicted table: linear (the tiles and h in one
# linear fit, a speed per tile and an overhead per sub-model), blend (the per-layer correction and the
# tiles taken as additive, weighed by h), tiles (the per-layer correction), none (the paper's).
CorrectionMode = Literal["linear", "blend", "tiles", "none"]
CORRECTIONS: tuple[CorrectionMode, ...] = ("linear", "blend", "tiles", "none")


class DeviceTimes:
    """Predicted range times per device, drift detection, and the adaptive update."""

    def __init__(
        self,
        predictor: LatencyPredictor,
        *,
        epsilon: float = 0.1,
        max_samples: int = 64,
        drift: DriftRule = "changed",
        correction: CorrectionMode = "linear",
        tiling: Sequence[Range] | None = None,
    ) -> None:
        """``tiling``: the ranges the devices measure with their ``h`` (the model's
        :func:`~edgeagent.predictor.measure.model_tiling`; None: :func:`even_tiling`)."""
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"epsilon {epsilon} must be a finite number > 0 (a share, e.g. 0.1 for 10 %)")
        if drift not in DRIFT_RULES:
            raise ValueError(f"drift rule {drift!r}: allowed {', '.join(map(repr, DRIFT_RULES))}")
        if correction not in CORRECTIONS:
            raise ValueError(f"correction {correction!r}: allowed {', '.join(map(repr, CORRECTIONS))}")
        self.predictor = predictor
        self.epsilon = epsilon
        self.drift = drift
        self.max_samples = max_samples
        self.correction = correction
        self.tiling = list(even_tiling(predictor.num_layers) if tiling is None else tiling)
        self.h: dict[str, tuple[float, ...]] = {}
        self.tiles: dict[str, tuple[float, ...]] = {}  # the tiling's seconds, measured with h
        self.samples: dict[tuple[str, int, int], Sample] = {}  # D^: the latest per device and range
        self.adaptations = 0
        self._tables: dict[str, list[list[float]]] = {}
        self.blend_weights: dict[str, float] = {}  # per device: the blend's weight on the correction
        self.fits: dict[str, TileFit] = {}  # per device: the linear fit (correction "linear")
        self._adapted_on: dict[tuple[str, int, int], float] = {}  # the D^ the predictor was adapted on
        # Per device and range under this h: how many times were observed, and the last as measured
        # (before ``load``).
        self._observed: dict[tuple[str, int, int], tuple[int, float]] = {}
        # A standing gap (ours, rule ``rescale``): per device, the range whose steady time in the pipeline
        # stands beyond epsilon of the prediction while its h has not changed; :meth:`close_gaps` rescales
        # the device's table to it before the next plan. ``scale``: that factor per device (1: none).
        self.gaps: dict[str, tuple[int, int]] = {}
        self.scale: dict[str, float] = {}
        self._lock = threading.Lock()

    def set_h(self, device: str, h: Sequence[float], tiles: Sequence[float] = ()) -> bool:
        """Take ``device``'s new ``h`` and the tiling's seconds measured with it (unused unless one finite
        positive time per range of the tiling); False (ignored) unless ``h`` is ten finite positive
        seconds that differ from the ones it has. Samples measured under the old ``h`` are dropped."""
        if not valid_h(h):
            return False
        values = tuple(float(v) for v in h)
        tiled = tuple(float(v) for v in tiles)
        if len(tiled) != len(self.tiling) or not all(math.isfinite(v) and v > 0 for v in tiled):
            tiled = ()
        with self._lock:
            if self.h.get(device) == values:
                return False  # the same announcement again (discovery asks every 2 s)
            self.h[device] = values
            self.tiles[device] = tiled
            self._tables.pop(device, None)
            self.blend_weights.pop(device, None)  # the new table's, once it is computed
            self.fits.pop(device, None)
            for key in [k for k in self.samples if k[0] == device]:
                del self.samples[key]  # measured under the old resources
            for key in [k for k in self._observed if k[0] == device]:
                del self._observed[key]
            self.gaps.pop(device, None)
            self.scale.pop(device, None)
        return True

    def representative_samples(self, device: str) -> list[Sample]:
        """The ten (sub-model, h, time) samples ``h`` itself is made of."""
        h = self.h[device]
        reps = representative(self.predictor.layer_flops)
        return [Sample(a, b, h, t) for (a, b), t in zip(reps, h, strict=True)]

    def known(self, device: str) -> bool:
        return device in self.h

    def table(self, device: str) -> list[list[float]] | None:
        """``table[s][e - s - 1]``: predicted seconds of layers ``[s, e)`` on ``device`` (None: no ``h``)."""
        with self._lock:
            cached = self._tables.get(device)
            h = self.h.get(device)
            tiles = self.tiles.get(device, ())
            predictor = self.predictor
            factor = self.scale.get(device, 1.0)
        if cached is not None or h is None:
            return cached
        table = predictor.table(h)
        weight, fit = None, None
        judges = list(zip(representative(predictor.layer_flops), h, strict=True))
        if self.correction == "tiles" and tiles:
            table = per_layer(table, self.tiling, tiles)
        elif self.correction == "blend" and tiles:
            table, weight = blended(table, self.tiling, tiles, judges)
        elif self.correction == "linear" and tiles:
            table, fit = fitted(table, self.tiling, tiles, judges)
        if factor != 1.0:
            table = [[factor * t for t in row] for row in table]
        with self._lock:
            if (
                self.predictor is predictor
                and self.h.get(device) == h
                and self.scale.get(device, 1.0) == factor
            ):
                self._tables[device] = table
                if weight is not None:
                    self.blend_weights[device] = weight
                if fit is not None:
                    self.fits[device] = fit
        return table

    def predict(self, device: str, start: int, end: int) -> float | None:
        table = self.table(device)
        return None if table is None else table[start][end - start - 1]

    def observe(
        self, device: str, start: int, end: int, measured: float, *, scale: float = 0.0, load: float = 1.0
    ) -> Drift | None:
        """A stage time measured on ``device`` for ``[start, end)``: ``measured / load`` is kept as a
        sample of ``D^`` (``load``: how much slower than alone the machine ran it, the caller's estimate);
        a :class:`Drift` if that is more than ``epsilon`` away from the prediction (the paper's trigger
        to measure ``h`` again). ``scale`` is in the same unit as the prediction.

        Two refinements of the paper's rule, so that a device is not stalled to re-measure an ``h`` that
        has not changed: the first time a device is seen in the pipeline under its ``h`` is adaptation data
        only (a stage in a busy pipeline does not run as fast as it did alone: the adaptive update learns
        that, a new ``h`` would not), and a difference smaller than ``epsilon * scale`` (the caller's
        typical stage time) is noise on a tiny stage, not a changed device.

        Rule ``changed`` (ours, the default) adds: the time must also differ by more than ``epsilon`` from
        the device's own last time on the same range under the same ``h``, both as measured (before
        ``load``: the caller's estimate of the load moves with its own stage, seen 1.42 -> 1.59 between
        two checks while the device's time stayed at 37-38 ms), and that last time must not be the
        range's first (a first window holds the warm-up: seen 10-30 % slower than the next). A new
        ``h`` helps only when the device changed; a standing gap between prediction and measurement is the
        predictor's error, which the adaptive update closes. Under the paper's rule that gap asked for
        ``h`` again and again, each time stopping the device's stage while it measured (seen: 0.6-0.88x
        the oracle's samples/s with the split the oracle chose), unless the gap is *gross* (``_gross``: a
        device several times slower or faster than its ``h`` says, from the start): that is recorded in
        :attr:`gaps` for :meth:`close_gaps`, as rule ``rescale`` records every gap beyond epsilon.
        ``paper``: the prediction alone."""
        predicted = self.predict(device, start, end)
        if predicted is None or not (math.isfinite(measured) and measured > 0):
            return None
        if not (math.isfinite(load) and load > 0):
            raise ValueError(f"load {load} must be a finite number > 0 (1: the device ran alone)")
        alone = measured / load
        with self._lock:
            seen = any(key[0] == device for key in self.samples)
            key = (device, start, end)
            windows, last = self._observed.get(key, (0, None))
            windows += 1
            self._observed[key] = (windows, measured)
            self.samples[key] = Sample(start, end, self.h[device], alone)
            while len(self.samples) > self.max_samples:
                del self.samples[next(iter(self.samples))]
        threshold = self.epsilon * max(predicted, scale)
        off = abs(alone - predicted) > threshold
        with self._lock:
            if off and (
                self.drift == "rescale"
                or (self.drift == "changed" and self._gross(device, alone, predicted, scale))
            ):
                self.gaps[device] = (start, end)
            else:
                self.gaps.pop(device, None)
        if not seen or not off:
            return None
        if self.drift != "paper" and (
            last is None or windows < 3 or abs(measured - last) <= threshold * load
        ):
            return None
        with self._lock:
            self.gaps.pop(device, None)  # a changed device: its new h, not a rescale, answers it
        return Drift(device, start, end, alone, predicted)

    def _gross(self, device: str, alone: float, predicted: float, scale: float) -> bool:
        """Under rule ``changed``, whether a standing gap is *gross*: a time at least ``GROSS_GAP`` times
        the prediction or at most its inverse, and by more than half the caller's typical stage time
        (``scale``), or any gap beyond epsilon of a device already rescaled for one (its table is known to
        be off, and one factor rarely closes it). Call with the lock held.

        Why a factor of 2: a CPU quota's non-linearity and a stage's fixed overhead put a device's stage
        time 24-33 % off its prediction from one range to the next (docs/design.md, "A standing gap,
        rescaled"), which a rescale chases back and forth; a device that became several times slower or
        faster after it measured its h is not that, and left alone it keeps the wrong split for the whole
        run. Why half a typical stage: a one- or two-layer stage is mostly that overhead (seen +320 % on
        2.7 ms predicted), and a few milliseconds there cannot move the pipeline's step."""
        if device in self.scale:
            return True
        low, high = sorted((alone, predicted))
        return high >= GROSS_GAP * low and high - low > 0.5 * scale

    def close_gaps(self) -> dict[str, tuple[float, float]]:
        """Rescale every device with a standing gap (:meth:`observe`) so that its table predicts the range's
        time as measured in the pipeline (over the load): per device, the factor applied now and its scale
        in all (:attr:`scale`). Under rule ``rescale`` it replaces :meth:`adapt` (see the central node's
        ``_adapt_predictor``); after it, it corrects the adapted tables.

        Why not the adaptive update alone: the corrections (``linear``, ``tiles``, ``blend``) anchor a
        device's table to the tiles it measured alone when it joined, so a net adapted on a stage time moves
        the shape of the table within a tile but not the tile's own time, and a join measured on a bad
        minute (seen: a two-thread worker under a 40 % quota measured at 0.33 s in one run and 0.45-0.85 s
        in the next three at its slowest representative) kept its wrong split for the whole run."""
        applied: dict[str, tuple[float, float]] = {}
        with self._lock:
            gaps = dict(self.gaps)
            self.gaps.clear()
        for device, (start, end) in gaps.items():
            sample = self.samples.get((device, start, end))
            predicted = self.predict(device, start, end)
            if sample is None or predicted is None or predicted <= 0:
                continue
            factor = sample.seconds / predicted
            if abs(factor - 1.0) <= self.epsilon:
                continue  # within epsilon of the table as it is now (an adaptation may have moved it)
            with self._lock:
                self.scale[device] = self.scale.get(device, 1.0) * factor
                self._tables.pop(device, None)
                applied[device] = (factor, self.scale[device])
        return applied

    def news(self) -> bool:
        """Whether ``D^`` holds a sample the predictor has not been adapted on: a new device or range, or a
        time more than ``epsilon / 2`` away from the one it was adapted on."""
        with self._lock:
            return any(
                key not in self._adapted_on
                or abs(s.seconds - self._adapted_on[key]) > 0.5 * self.epsilon * self._adapted_on[key]
                for key, s in self._adaptable().items()
            )

    def _adaptable(self) -> dict[tuple[str, int, int], Sample]:
        """The samples of ``D^`` the net is adapted on: not those of a rescaled device (:attr:`scale`), whose
        table the factor already anchors to its measured times (the net learning them too would count
        the gap twice). Call with the lock held."""
        return {key: s for key, s in self.samples.items() if key[0] not in self.scale}

    def adapt(self, steps: int = 150) -> int:
        """Continue training on ``D`` plus every sample of ``D^`` (papers/004 "Adaptive update") when there
        is news (:meth:`news`); returns how many samples it used (0: nothing new). Runs off the training
        thread (a few hundred small steps); the tables follow the new predictor."""
        if not self.news():
            return 0
        with self._lock:
            adaptable = self._adaptable()
            samples = list(adaptable.values())
            self._adapted_on = {key: s.seconds for key, s in adaptable.items()}
            base = self.predictor
        adapted = base.adapt(samples, steps=steps)
        with self._lock:
            self.predictor = adapted
            self._tables.clear()
            self.adaptations += 1
        return len(samples)


__all__ = ["CORRECTIONS", "DRIFT_RULES", "CorrectionMode", "DeviceTimes", "Drift", "DriftRule", "valid_h"]
