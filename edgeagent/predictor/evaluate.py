"""Prediction accuracy on held-out resource configurations (papers/004 Sec. 4.2.1 and Fig. 8).

For every held-out record (one configuration: ``h`` and every sub-model's measured time) the share of
sub-models predicted within ±5 % and ±10 % by

* the predictor as pre-trained, and after the adaptive update with 2, 4 and 8 samples of that
  configuration (the paper's protocol: the samples are the device's representative sub-models, which
  ``h`` already measured);
* ours after 2, 4 and 8 samples: the pre-trained predictor with the per-layer correction
  (:mod:`.correction`) fitted on a tiling of the model into that many ranges, measured on that
  configuration;
* ours after 2, 4 and 8 samples, blended: that correction and the tiles taken as additive, weighed by
  the representatives (:func:`~.correction.blended`);
* ours after 2, 4 and 8 samples, linear (the default): the tiles and the representatives in one linear
  fit, a per-tile speed and a per-sub-model overhead (:class:`~.correction.TileFit`);
* FLOPs-linear, the per-layer look-up table and FTPipeHD's capacity ratio.

Every method is scored on the same sub-models: those that no method measured as an input (:func:`scored`:
not a single layer, a representative, a tile or the capacity estimate's stage). Until 2026-11-28 each
of ours was scored without its own inputs but the baselines on every sub-model, the look-up table on
its own 21 single layers too (exact by construction).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgeagent.models import ModelSpec
from edgeagent.planner.partition import balanced_partition
from edgeagent.predictor.baselines import capacity_ratio, flops_linear, lookup_table, within
from edgeagent.predictor.correction import Correction, blended, fitted
from edgeagent.predictor.measure import best_window, model_tiling
from edgeagent.predictor.net import LatencyPredictor, Sample
from edgeagent.predictor.store import record_h
from edgeagent.predictor.submodels import Range, representative

ADAPT_SAMPLES = (2, 4, 8)
BOUNDS = (0.05, 0.10)


@dataclass
class Scores:
    """Share within each bound, per method, averaged over configurations on :meth:`mean`."""

    rows: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def add(self, method: str, predicted: Sequence[float], measured: Sequence[float]) -> None:
        pair = (within(predicted, measured, BOUNDS[0]), within(predicted, measured, BOUNDS[1]))
        self.rows.setdefault(method, []).append(pair)

    def mean(self) -> dict[str, tuple[float, float]]:
        return {
            method: (sum(p[0] for p in pairs) / len(pairs), sum(p[1] for p in pairs) / len(pairs))
            for method, pairs in self.rows.items()
        }


def _times(record: Mapping[str, Any]) -> dict[Range, float]:
    return {(int(s), int(e)): float(t) for (s, e), t in zip(record["ranges"], record["seconds"], strict=True)}


def repeatability(record: Mapping[str, Any]) -> tuple[float, float] | None:
    """How well the measurement repeats itself on ``record``'s configuration: the share of sub-models
    whose time from the even rounds (:func:`~edgeagent.predictor.measure.best_window`) lies within ±5 %
    and ±10 % of the time from the odd rounds (None: a record without per-round windows). Pessimistic:
    each half has half the windows the record's time is taken from, and a drift of the machine between
    rounds counts against it."""
    windows = record.get("round_seconds")
    if not windows or len(windows[0]) < 2:
        return None
    even = [best_window(w[0::2]) for w in windows]
    odd = [best_window(w[1::2]) for w in windows]
    return within(even, odd, BOUNDS[0]), within(even, odd, BOUNDS[1])


def reference_record(records: Sequence[Mapping[str, Any]], batch_size: int) -> Mapping[str, Any]:
    """The central node of FTPipeHD's capacity estimate: a full-speed configuration (no quota, no
    emulated slowdown, this machine's own instruction set, one core's worth) at the nearest batch size."""

    def rank(r: Mapping[str, Any]) -> tuple[int, int, int]:
        cfg = r["config"]
        full = cfg.get("cpu_quota") is None and float(cfg.get("slowdown", 1.0)) == 1.0 and not cfg.get("isa")
        return (0 if full else 1, abs(int(r["batch_size"]) - batch_size), int(cfg.get("threads", 1)))

    return min(records, key=rank)


def _layer_times(times: Mapping[Range, float], num_layers: int) -> list[float]:
    return [times[(j, j + 1)] for j in range(num_layers)]


def _guesses(
    method: str,
    predicted: Mapping[Range, float],
    num_layers: int,
    tiles: Sequence[Range],
    reps: Sequence[Range],
    times: Mapping[Range, float],
    test: Sequence[Range],
) -> list[float]:
    """The times of ``test`` by ``method`` from the ``predicted`` table and the ``times`` measured on the
    ``tiles`` and the representatives ``reps``: ``blended`` (the per-layer correction and the tiles added
    up, weighed by the representatives) or ``linear`` (:class:`~.correction.TileFit` on both)."""
    table = [[predicted[(a, b)] for b in range(a + 1, num_layers + 1)] for a in range(num_layers)]
    seconds, judges = [times[r] for r in tiles], [(r, times[r]) for r in reps]
    if method == "linear":
        out, _ = fitted(table, tiles, seconds, judges)
    else:
        out, _ = blended(table, tiles, seconds, judges)
    return [out[a][b - a - 1] for a, b in test]


def _inside_one_tile(tiles: Sequence[Range], ranges: Sequence[Range]) -> int:
    """How many of ``ranges`` lie inside one of ``tiles``: no tile measures them, the predictor's shares
    of the tile decide."""
    return sum(any(a <= s and e <= b for a, b in tiles) for s, e in ranges)


def scored(
    ranges: Sequence[Range], num_layers: int, reps: Sequence[Range], tilings: Sequence[Sequence[Range]]
) -> list[Range]:
    """The sub-models of ``ranges`` every method is scored on: none that any method had measured as an
    input. Those are the single layers (the look-up table's), the representatives (``h``: the
    predictor's, FLOPs-linear's and the paper's adaptive samples) and every range of ``tilings`` (ours,
    and the capacity estimate's stage). A method is not scored on what it measured, and all are scored
    on the same sub-models (papers/004 Sec. 4.2.1 compares them so)."""
    inputs = {*reps, *((j, j + 1) for j in range(num_layers)), *(r for t in tilings for r in t)}
    test = [r for r in ranges if r not in inputs]
    if not test:
        raise ValueError(
            f"the {num_layers}-layer model's {len(ranges)} sub-models are all some method's inputs (single "
            f"layers, {len(set(reps))} representatives, tiles): nothing is left to test; evaluate a deeper "
            "model"
        )
    return test


def _single_layers(num_layers: int, tiles: Sequence[Range], reps: Sequence[Range]) -> list[Range]:
    """The single layers that are neither a tile nor a representative: no method is scored on them (the
    look-up table measured them), but ours predicts them from the net's share of their tile."""
    inputs = {*tiles, *reps}
    return [(j, j + 1) for j in range(num_layers) if (j, j + 1) not in inputs]


def _capacity_stage(
    training: Sequence[Mapping[str, Any]], record: Mapping[str, Any], num_layers: int
) -> tuple[list[float], Range]:
    """FTPipeHD's reference per-layer times for ``record``'s batch size, and the stage it measures (the
    middle one of the equal 3-way split)."""
    ref_layers = _layer_times(_times(reference_record(training, int(record["batch_size"]))), num_layers)
    points = balanced_partition(ref_layers, 3)
    return ref_layers, (points[1], points[2])


def _inputs(
    predictor: LatencyPredictor, held_out: Sequence[Mapping[str, Any]]
) -> tuple[list[Range], dict[int, list[Range]]]:
    """The representatives of ``h`` and the tiling of every :data:`ADAPT_SAMPLES` count (none without
    records). Every record is of the predictor's model: they are the same for all of them."""
    reps = representative(predictor.layer_flops)
    if not held_out:
        return reps, {}
    spec = ModelSpec.from_dict(held_out[0]["model"])
    return reps, {k: model_tiling(spec, predictor.layer_flops, k) for k in ADAPT_SAMPLES}


def evaluate(
    predictor: LatencyPredictor,
    held_out: Sequence[Mapping[str, Any]],
    training: Sequence[Mapping[str, Any]],
    *,
    adapt_steps: int = 300,
) -> tuple[Scores, list[dict[str, Any]]]:
    """Scores over ``held_out`` and one row per configuration (its name, every method's shares and, under
    ``misses``, per ``blended+k`` and ``linear+k`` how many sub-models it tested and predicted outside
    ±10 %, how many of each lie inside one tile, and how many of the single layers that are not its
    inputs it would predict outside ±10 %: no method is scored on those, the look-up table measures them)."""
    scores = Scores()
    per_config: list[dict[str, Any]] = []
    n = predictor.num_layers
    reps, tilings = _inputs(predictor, held_out)
    for record in held_out:
        times = _times(record)
        ranges = sorted(times)
        h = record_h(record)
        ref_layers, stage = _capacity_stage(training, record, n)
        test = scored(ranges, n, reps, [*tilings.values(), [stage]])
        measured = [times[r] for r in test]
        local = Scores()
        predicted = dict(zip(ranges, predictor.predict(ranges, h), strict=True))
        local.add("predictor", [predicted[r] for r in test], measured)
        for k in ADAPT_SAMPLES:
            samples = [Sample(a, b, h, times[(a, b)]) for a, b in reps[:k]]
            adapted = predictor.adapt(samples, steps=adapt_steps)
            local.add(f"predictor+{k}", adapted.predict(test, h), measured)
        singles = [predicted[(j, j + 1)] for j in range(n)]
        misses: dict[str, dict[str, int]] = {}  # blended+k's and linear+k's sub-models outside ±10 %
        for k, tiles in tilings.items():
            fit = Correction.fit(singles, [(r, predicted[r], times[r]) for r in tiles])
            local.add(f"corrected+{k}", [predicted[r] * fit.factor(*r) for r in test], measured)
            ones = _single_layers(n, tiles, reps)
            for method in ("blended", "linear"):
                guessed = _guesses(method, predicted, n, tiles, reps, times, [*test, *ones])
                local.add(f"{method}+{k}", guessed[: len(test)], measured)
                wrong = [
                    r
                    for r, g in zip([*test, *ones], guessed, strict=True)
                    if abs(g - times[r]) > BOUNDS[1] * times[r]
                ]
                missed = [(a, b) for a, b in wrong if b - a > 1]
                misses[f"{method}+{k}"] = {
                    "tested": len(test),
                    "tested inside one tile": _inside_one_tile(tiles, test),
                    "missed": len(missed),
                    "missed inside one tile": _inside_one_tile(tiles, missed),
                    "single layers": len(ones),
                    "single layers missed": len(wrong) - len(missed),
                }
        local.add("flops-linear", flops_linear(predictor.layer_flops, h, test), measured)
        local.add("lookup-table", lookup_table(_layer_times(times, n), test), measured)
        local.add("capacity", capacity_ratio(ref_layers, stage, times[stage], test), measured)
        for method, pairs in local.rows.items():
            scores.rows.setdefault(method, []).extend(pairs)
        per_config.append({"config": record["config"].get("name", "?"), **local.mean(), "misses": misses})
    return scores, per_config


LENGTHS: tuple[tuple[int, int], ...] = ((1, 1), (2, 3), (4, 7), (8, 10**9))  # sub-model lengths, in layers


def by_length(
    predictor: LatencyPredictor, held_out: Sequence[Mapping[str, Any]], training: Sequence[Mapping[str, Any]]
) -> dict[str, dict[tuple[int, int], tuple[int, int]]]:
    """linear+8's and the look-up table's sub-models within ±10 % and tested, per band of :data:`LENGTHS`:
    the :func:`scored` sub-models, and the single layers that are not linear+8's inputs (which no method
    is scored on: the look-up table measured them, so it is exact there). A deep pipeline's stages are
    short ranges; this says how far each method is to be trusted on them."""
    n = predictor.num_layers
    reps, tilings = _inputs(predictor, held_out)
    tiles = tilings.get(8, [])  # linear+8's
    counts = {m: dict.fromkeys(LENGTHS, (0, 0)) for m in ("linear+8", "lookup-table")}
    for record in held_out:
        times = _times(record)
        ranges = sorted(times)
        _, stage = _capacity_stage(training, record, n)
        test = [*scored(ranges, n, reps, [*tilings.values(), [stage]]), *_single_layers(n, tiles, reps)]
        predicted = dict(zip(ranges, predictor.predict(ranges, record_h(record)), strict=True))
        guesses = {
            "linear+8": _guesses("linear", predicted, n, tiles, reps, times, test),
            "lookup-table": lookup_table(_layer_times(times, n), test),
        }
        for method, guessed in guesses.items():
            for (a, b), g in zip(test, guessed, strict=True):
                band = next(band for band in LENGTHS if band[0] <= b - a <= band[1])
                hit = abs(g - times[(a, b)]) <= BOUNDS[1] * times[(a, b)]
                hits, tested = counts[method][band]
                counts[method][band] = (hits + hit, tested + 1)
    return counts


def fewer_windows(predictor: LatencyPredictor, held_out: Sequence[Mapping[str, Any]], k: int) -> Scores:
    """linear+8, blended+8 and the look-up table as a device measures its inputs (``h``, tiles, single
    layers): each from the fastest of only ``k`` windows (a worker measures ``characterise_rounds`` of
    them), tested against the times of *other* windows. A record of ``R`` rounds gives its last ``R // 2``
    windows to the times tested on and its first ``R // 2``, ``k`` at a time, to the inputs; a record with
    fewer than ``2 k`` rounds is left out. With ``k`` = ``R // 2``: how much each method's inputs' own noise
    costs it once they no longer share windows with what they are tested on."""
    if k < 1:
        raise ValueError(f"k must be >= 1 window, got {k}")
    scores = Scores()
    n = predictor.num_layers
    reps, tilings = _inputs(predictor, held_out)
    tiles = tilings.get(8, [])  # linear+8's and blended+8's
    for record in held_out:
        windows = record.get("round_seconds") or [[]]
        half = len(windows[0]) // 2
        if half < k:
            continue
        truth = _times({**record, "seconds": [best_window(w[half:]) for w in windows]})
        for first in range(0, half - k + 1, k):
            used = {**record, "seconds": [best_window(w[first : first + k]) for w in windows]}
            inputs = _times(used)
            ranges = sorted(inputs)
            predicted = dict(zip(ranges, predictor.predict(ranges, record_h(used)), strict=True))
            test = scored(ranges, n, reps, [tiles])
            guesses = _guesses("blended", predicted, n, tiles, reps, inputs, test)
            scores.add("blended+8", guesses, [truth[r] for r in test])
            lines = _guesses("linear", predicted, n, tiles, reps, inputs, test)
            scores.add("linear+8", lines, [truth[r] for r in test])
            singles = lookup_table(_layer_times(inputs, n), test)
            scores.add("lookup-table", singles, [truth[r] for r in test])
    return scores


SWEEP_SAMPLES = (2, 4, 6, 8, 10, 12, 14)  # Fig. 8's x axis: 2 to 14 adaptive samples


def sample_sweep(
    predictor: LatencyPredictor,
    held_out: Sequence[Mapping[str, Any]],
    counts: Sequence[int] = SWEEP_SAMPLES,
    *,
    adapt_steps: int = 300,
    seed: int = 0,
) -> dict[int, dict[str, tuple[float, float]]]:
    """Fig. 8 (papers/004 Sec. 4.2.1): per count ``k`` of adaptive samples, the shares within ±5 % / ±10 %
    of the paper's update (``predictor+k``: the representatives first, then, past them, sub-models drawn
    at random, as the paper fills up ``D_hat``) and of ours (``linear+k``: the linear fit on a tiling into
    ``k`` ranges). Both are scored on the same sub-models for every ``k``: those no ``k``'s inputs hold."""
    if not held_out:
        return {}
    n = predictor.num_layers
    reps, _ = _inputs(predictor, held_out)
    spec = ModelSpec.from_dict(held_out[0]["model"])
    tilings = {k: model_tiling(spec, predictor.layer_flops, k) for k in counts}
    out: dict[int, Scores] = {k: Scores() for k in counts}
    for record in held_out:
        times = _times(record)
        ranges = sorted(times)
        h = record_h(record)
        others = [r for r in ranges if r not in reps and r[1] - r[0] > 1]
        extra = random.Random(f"{seed}:{record['config'].get('name', '?')}").sample(
            others, max(0, max(counts) - len(reps))
        )
        picked = {k: [*reps[:k], *extra[: max(0, k - len(reps))]] for k in counts}
        test = scored(ranges, n, [*reps, *extra], list(tilings.values()))
        measured = [times[r] for r in test]
        predicted = dict(zip(ranges, predictor.predict(ranges, h), strict=True))
        for k in counts:
            samples = [Sample(a, b, h, times[(a, b)]) for a, b in picked[k]]
            out[k].add("predictor", predictor.adapt(samples, steps=adapt_steps).predict(test, h), measured)
            guessed = _guesses("linear", predicted, n, tilings[k], reps, times, test)
            out[k].add("linear", guessed, measured)
    return {k: scores.mean() for k, scores in out.items()}


__all__ = [
    "ADAPT_SAMPLES",
    "BOUNDS",
    "LENGTHS",
    "SWEEP_SAMPLES",
    "Scores",
    "by_length",
    "evaluate",
    "fewer_windows",
    "reference_record",
    "repeatability",
    "sample_sweep",
    "scored",
]
