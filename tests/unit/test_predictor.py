"""The latency predictor's pure parts (papers/004 Sec. 3.2): sub-models, encodings, the representative
ten, the baselines, the DP over predicted tables, and a predictor that trains and adapts (small, fast,
on a synthetic device family whose layers do not all scale alike)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from edgeagent.models import ModelSpec
from edgeagent.modes.pipeline.central.estimation import Estimation
from edgeagent.planner.dp import Link, Problem, brute_force, compute_time, predict, solve
from edgeagent.predictor.baselines import capacity_ratio, flops_linear, lookup_table, within
from edgeagent.predictor.correction import Correction, blended, even_tiling, fitted
from edgeagent.predictor.evaluate import scored
from edgeagent.predictor.net import LatencyPredictor, Sample
from edgeagent.predictor.store import load, save
from edgeagent.predictor.submodels import all_ranges, by_flops, encode, representative
from edgeagent.predictor.tracker import DeviceTimes, Drift

# -- sub-models ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layers", [1, 2, 5, 21])
def test_all_ranges_are_the_contiguous_sub_models(layers: int) -> None:
    ranges = all_ranges(layers)
    assert len(ranges) == layers * (layers + 1) // 2
    assert len(set(ranges)) == len(ranges)
    assert all(0 <= s < e <= layers for s, e in ranges)


def test_encoding_is_the_papers_binary_vector() -> None:
    # The paper's example: layers 3..7 of a 10-layer model (1-based) are [2, 7) here.
    assert encode(2, 7, 10) == [0, 0, 1, 1, 1, 1, 1, 0, 0, 0]
    with pytest.raises(ValueError, match="outside"):
        encode(3, 3, 10)


def test_representative_are_the_flops_ranks_k_m_minus_1_over_9() -> None:
    flops = [float(v) for v in (5, 1, 8, 2, 9, 3, 7)]
    ranked = by_flops(flops)
    m = len(ranked)
    assert m == 28
    reps = representative(flops)
    assert len(reps) == 10
    assert reps == [ranked[k * (m - 1) // 9] for k in range(10)]
    assert reps[0] == ranked[0] and reps[-1] == ranked[-1] == (0, 7)  # the cheapest and the whole model
    sums = [sum(flops[a:b]) for a, b in reps]
    assert sums == sorted(sums)


def test_representative_of_a_tiny_model_repeats_to_keep_ten() -> None:
    assert len(representative([1.0])) == 10
    assert set(representative([1.0, 2.0])) <= set(all_ranges(2))


# -- baselines and the metric ----------------------------------------------------------------------


def test_within_counts_relative_errors() -> None:
    assert within([1.04, 0.9, 1.2], [1.0, 1.0, 1.0], 0.05) == pytest.approx(1 / 3)
    assert within([1.04, 0.9, 1.2], [1.0, 1.0, 1.0], 0.10) == pytest.approx(2 / 3)


def test_baselines_are_exact_on_their_own_assumptions() -> None:
    flops = [1.0, 2.0, 3.0, 4.0]
    h = [2.0 * sum(flops[a:b]) + 0.5 for a, b in representative(flops)]
    ranges = all_ranges(4)
    assert flops_linear(flops, h, ranges) == pytest.approx([2.0 * sum(flops[a:b]) + 0.5 for a, b in ranges])
    assert lookup_table([1.0, 2.0, 3.0, 4.0], [(1, 3)]) == [5.0]
    # Capacity: the stage [1, 3) took 3x its reference time, so every range is 3x.
    assert capacity_ratio([1.0, 2.0, 3.0, 4.0], (1, 3), 15.0, [(0, 4)]) == [30.0]


def test_every_method_is_scored_on_the_sub_models_no_method_measured() -> None:
    """``scored``: the single layers (the look-up table's inputs), the representatives and the tiles are
    left out for every method alike; a model whose every sub-model is an input is an error."""
    ranges = all_ranges(6)  # 21 sub-models
    reps = [(0, 6), (1, 4)]
    test = scored(ranges, 6, reps, [[(0, 2), (2, 6)], [(3, 5)]])
    inputs = {(0, 6), (1, 4), (0, 2), (2, 6), (3, 5)}
    assert test == [r for r in ranges if r[1] - r[0] > 1 and r not in inputs]
    assert len(test) == 21 - 6 - 5
    with pytest.raises(ValueError, match="3-layer model's 6 sub-models are all some method's inputs"):
        scored(all_ranges(3), 3, [(0, 2), (1, 3), (0, 3)], [])


# -- the DP over predicted tables (AccEPT eq. 9-10) ------------------------------------------------


def _table(per_layer: list[float], overhead: float) -> list[list[float]]:
    n = len(per_layer)
    return [[overhead + sum(per_layer[s:e]) for e in range(s + 1, n + 1)] for s in range(n)]


def test_dp_uses_the_predicted_range_times_and_agrees_with_brute_force() -> None:
    rng = random.Random(3)
    for _ in range(40):
        n, stages = rng.randint(3, 8), rng.randint(2, 3)
        stages = min(stages, n)
        layer_times = [rng.uniform(0.1, 1.0) for _ in range(n)]
        tables = [None] + [
            _table([rng.uniform(0.1, 3.0) for _ in range(n)], rng.uniform(0, 0.5)) for _ in range(stages - 1)
        ]
        p = Problem(
            layer_times=tuple(layer_times),
            output_bytes=tuple(rng.randint(1, 1000) for _ in range(n)),
            capacities=(1.0,) * stages,
            links=tuple(Link(rng.uniform(1e3, 1e5)) for _ in range(stages - 1)),
            range_times=tuple(None if t is None else tuple(tuple(r) for r in t) for t in tables),
        )
        points = solve(p)
        assert predict(p, points) == pytest.approx(predict(p, brute_force(p)))
        table = tables[-1]
        assert table is not None
        assert compute_time(p, stages - 1, points[-2], n) == table[points[-2]][n - points[-2] - 1]


def test_dp_rejects_a_table_of_the_wrong_shape() -> None:
    with pytest.raises(ValueError, match="range_times"):
        Problem(
            layer_times=(1.0, 1.0),
            output_bytes=(1, 1),
            capacities=(1.0, 1.0),
            links=(Link(1.0),),
            range_times=(None, ((1.0,), (1.0,))),
        )


# -- the predictor ---------------------------------------------------------------------------------

LAYERS = 8
_RNG = random.Random(0)
FLOPS = [_RNG.uniform(1e6, 1e8) for _ in range(LAYERS)]
KIND = [_RNG.random() < 0.5 for _ in range(LAYERS)]


def _device(speed: float, penalty: float, overhead: float):  # type: ignore[no-untyped-def]
    """Seconds of [s, e): a device where one kind of layer runs ``penalty`` times slower than the other
    (per-layer scaling would be wrong on it), plus a fixed per-call overhead."""

    def seconds(s: int, e: int) -> float:
        return speed * (sum(FLOPS[j] * (penalty if KIND[j] else 1.0) for j in range(s, e)) * 1e-9 + overhead)

    return seconds


def _samples(seconds) -> list[Sample]:  # type: ignore[no-untyped-def]
    h = tuple(seconds(a, b) for a, b in representative(FLOPS))
    return [Sample(a, b, h, seconds(a, b)) for a, b in all_ranges(LAYERS)]


@pytest.fixture(scope="module", autouse=True)
def one_thread():  # type: ignore[no-untyped-def]
    """Tiny networks: one thread (two threads on a busy 2-core machine are 15x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def trained() -> LatencyPredictor:
    rng = random.Random(1)
    data: list[Sample] = []
    for _ in range(12):
        data += _samples(_device(rng.uniform(0.5, 8), rng.uniform(0.5, 2), rng.uniform(5e-4, 3e-3)))
    return LatencyPredictor.fit(data, FLOPS, variant="features", steps=800, seed=0)


def test_predictor_predicts_a_held_out_device_better_than_flops_linear(trained: LatencyPredictor) -> None:
    held_out = _device(3.3, 1.8, 1e-3)
    ranges = all_ranges(LAYERS)
    measured = [held_out(a, b) for a, b in ranges]
    h = [held_out(a, b) for a, b in representative(FLOPS)]
    ours = within(trained.predict(ranges, h), measured, 0.10)
    assert ours >= 0.9
    assert ours > within(flops_linear(FLOPS, h, ranges), measured, 0.10)


def test_adaptive_update_improves_on_a_device_the_pre_training_never_saw(trained: LatencyPredictor) -> None:
    odd = _device(2.0, 4.0, 2e-3)  # a layer kind 4x slower: outside the pre-training's 0.5-2
    ranges = all_ranges(LAYERS)
    h = tuple(odd(a, b) for a, b in representative(FLOPS))
    measured = [odd(a, b) for a, b in ranges]

    def error(p: LatencyPredictor) -> float:
        return sum(abs(math.log(x / m)) for x, m in zip(p.predict(ranges, h), measured, strict=True))

    samples = [Sample(a, b, h, odd(a, b)) for a, b in ranges[:: max(1, len(ranges) // 8)]][:8]
    adapted = trained.adapt(samples, steps=300)
    assert error(adapted) < error(trained)
    assert adapted is not trained and trained.predict(ranges[:1], h) == trained.predict(ranges[:1], h)


def test_tables_have_the_dp_shape_and_a_store_round_trip(trained: LatencyPredictor, tmp_path: Path) -> None:
    h = [0.001 * (k + 1) for k in range(10)]
    table = trained.table(h)
    assert [len(row) for row in table] == [LAYERS - s for s in range(LAYERS)]
    path = tmp_path / "p.pt"
    save(trained, path, model=ModelSpec("mlp", (16,), 4), provenance={"data": "synthetic"})
    loaded, header = load(path)
    assert header["provenance"] == {"data": "synthetic"}
    flat = [v for row in table for v in row]
    assert [v for row in loaded.table(h) for v in row] == pytest.approx(flat)
    assert len(loaded.data) == len(trained.data)


def test_a_malformed_predictor_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.pt"
    path.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="cannot read a predictor file"):
        load(path)
    torch.save({"format": 1}, path)
    with pytest.raises(ValueError, match="not a predictor file"):
        load(path)


def test_predictor_rejects_a_bad_h(trained: LatencyPredictor) -> None:
    with pytest.raises(ValueError, match="h must be"):
        trained.predict([(0, 1)], [0.001] * 9)
    with pytest.raises(ValueError, match="h must be"):
        trained.predict([(0, 1)], [float("nan")] * 10)


# -- dynamic prediction ----------------------------------------------------------------------------


def test_device_times_flag_drift_beyond_epsilon_and_adapt(trained: LatencyPredictor) -> None:
    times = DeviceTimes(trained, epsilon=0.1, drift="paper")
    device = _device(2.0, 1.0, 1e-3)
    assert times.set_h("w1", [device(a, b) for a, b in representative(FLOPS)])
    assert not times.set_h("w2", [1.0] * 9)
    predicted = times.predict("w1", 2, 5)
    assert predicted is not None
    # The first time in the pipeline is adaptation data only, however far off.
    assert times.observe("w1", 2, 5, predicted * 3.0) is None
    assert times.observe("w1", 2, 5, predicted * 1.05) is None
    drift = times.observe("w1", 2, 5, predicted * 1.5)
    assert drift is not None and drift.error == pytest.approx(0.5)
    # A difference below epsilon of the typical stage time is noise on a tiny stage.
    assert times.observe("w1", 2, 5, predicted * 1.5, scale=100 * predicted) is None
    assert times.observe("w2", 2, 5, 1.0) is None  # no h: nothing to compare with
    # The same h again changes nothing; a new h drops the samples measured under the old one.
    h = times.h["w1"]
    assert not times.set_h("w1", h)
    assert times.set_h("w1", [2 * v for v in h])
    assert times.observe("w1", 2, 5, predicted * 3.0) is None
    before = times.predictor
    assert times.news()
    assert times.adapt(steps=20) == 1  # the one sample under the new h
    assert not times.news() and times.adapt(steps=20) == 0  # nothing new since
    assert times.observe("w1", 2, 5, predicted * 3.0 * 1.5) is not None  # a changed time is news
    assert times.adapt(steps=20) == 1
    assert times.predictor is not before and times.adaptations == 2


def test_a_standing_gap_is_the_predictors_error_but_a_change_is_a_drift(trained: LatencyPredictor) -> None:
    device = _device(2.0, 1.0, 1e-3)
    h = [device(a, b) for a, b in representative(FLOPS)]
    flagged: dict[str, list[bool]] = {}
    for rule in ("paper", "changed", "rescale"):
        times = DeviceTimes(trained, epsilon=0.1, drift=rule)
        assert times.set_h("w1", h)
        predicted = times.predict("w1", 2, 5)
        assert predicted is not None
        # A first window with the warm-up in it, then a steady 25 % above the prediction, then 2x that.
        flagged[rule] = [
            times.observe("w1", 2, 5, predicted * factor) is not None for factor in (1.6, 1.25, 1.26, 2.5)
        ]
    assert flagged == {
        "paper": [False, True, True, True],
        "changed": [False, False, False, True],
        "rescale": [False, False, False, True],  # a standing gap is rescaled (close_gaps), not re-measured
    }
    with pytest.raises(ValueError, match="drift rule 'often'"):
        DeviceTimes(trained, drift="often")  # type: ignore[arg-type]


def test_a_changed_load_estimate_is_not_a_changed_device(trained: LatencyPredictor) -> None:
    """Rule ``changed`` compares a device with its own last time as measured: the caller's load estimate
    moving (its own stage) does not make the device's unchanged time a drift; the device's time does."""
    device = _device(2.0, 1.0, 1e-3)
    times = DeviceTimes(trained, epsilon=0.1)
    assert times.set_h("w1", [device(a, b) for a, b in representative(FLOPS)])
    predicted = times.predict("w1", 2, 5)
    assert predicted is not None
    raw = 2.0 * predicted  # measured twice as slow as predicted, on a machine 1.4x loaded
    flagged = [
        times.observe("w1", 2, 5, raw * change, load=load) is not None
        for change, load in ((1.0, 1.4), (1.0, 1.4), (1.0, 1.6), (1.0, 1.3), (1.5, 1.4))
    ]
    assert flagged == [False, False, False, False, True]
    sample = times.samples[("w1", 2, 5)]
    assert sample.seconds == pytest.approx(raw * 1.5 / 1.4)  # D^ holds the time the device takes alone
    with pytest.raises(ValueError, match="load 0"):
        times.observe("w1", 2, 5, raw, load=0)


def test_interleaved_rounds_keep_every_window_and_h_is_their_fastest() -> None:
    from edgeagent.predictor.measure import ModelLayers, best_window, characterise, measure_rounds

    model = ModelLayers.build(ModelSpec("mlp", (1, 8, 8), 10), 4)
    ranges = all_ranges(model.num_layers)[:3]
    windows = measure_rounds(model, ranges, rounds=3, reps=1, min_seconds=0.0)
    assert [len(w) for w in windows] == [3, 3, 3] and all(t > 0 for w in windows for t in w)
    assert measure_rounds(model, ranges, rounds=2, reps=1, min_seconds=0.0, budget=0.0) == [[], [], []]
    assert characterise(model, rounds=2, reps=1, min_seconds=0.0).complete
    assert characterise(model, budget=0.0, rounds=2, reps=1, min_seconds=0.0).h == ()
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        measure_rounds(model, ranges, rounds=0)
    assert best_window([0.3, 0.1, 0.5, 0.2]) == 0.1  # interference only adds time
    with pytest.raises(ValueError, match="no windows"):
        best_window([])


def test_the_tiles_a_device_measured_correct_its_table(trained: LatencyPredictor) -> None:
    """The tiling a device measured with its h corrects the DP's table by :class:`Correction` (whose gain
    on real devices is tested on the shipped data, test_predictor_correction.py); without the correction,
    or with malformed tiles, the table is the predictor's."""
    device = _device(2.0, 1.0, 1e-3)
    h = [device(a, b) for a, b in representative(FLOPS)]
    tiles = [1.5 * device(a, b) for a, b in even_tiling(LAYERS)]
    plain = DeviceTimes(trained, correction="none")
    corrected = DeviceTimes(trained, correction="tiles")
    mixed = DeviceTimes(trained, correction="blend")
    fit = DeviceTimes(trained)  # linear, the default
    broken = DeviceTimes(trained)
    assert plain.set_h("w1", h, tiles) and corrected.set_h("w1", h, tiles)
    assert broken.set_h("w1", h, tiles[:-1]) and broken.tiles["w1"] == ()  # one tile short: not used
    table = trained.table(h)
    assert broken.table("w1") == plain.table("w1") == table
    samples = [((a, b), table[a][b - a - 1], t) for (a, b), t in zip(even_tiling(LAYERS), tiles, strict=True)]
    expected = Correction.fit([row[0] for row in table], samples).apply(table)
    assert corrected.table("w1") == expected != table
    assert corrected.predict("w1", 2, 5) == expected[2][2]
    assert mixed.set_h("w1", h, tiles)
    judges = list(zip(representative(FLOPS), h, strict=True))
    blend_table, weight = blended(table, even_tiling(LAYERS), tiles, judges)
    assert mixed.table("w1") == blend_table != table
    assert mixed.blend_weights == {"w1": weight} and not corrected.blend_weights and not mixed.fits
    assert fit.set_h("w1", h, tiles)
    fit_table, tile_fit = fitted(table, even_tiling(LAYERS), tiles, judges)
    assert fit.table("w1") == fit_table != table
    assert fit.fits == {"w1": tile_fit} and not fit.blend_weights
    with pytest.raises(ValueError, match="correction 'tile': allowed 'linear', 'blend', 'tiles', 'none'"):
        DeviceTimes(trained, correction="tile")  # type: ignore[arg-type]


def test_a_late_drift_does_not_stop_a_stage_to_measure_h_again() -> None:
    """Under the ``changed`` rule a new ``h`` is asked for only when a new split could save more of the
    time left than the measurement stalls the stage (9.5 s here); the paper's rule always asks."""
    slower = Drift("worker-1", 11, 20, measured=0.0698, predicted=0.0575)  # +21 %: 17.6 % recoverable
    assert slower.recoverable == pytest.approx(0.0123 / 0.0698)
    assert Drift("w", 0, 1, measured=0.1, predicted=0.4).recoverable == pytest.approx(0.75)
    events: list[str] = []

    def run(rule: str = "changed") -> Any:
        return SimpleNamespace(
            device_times=SimpleNamespace(drift=rule),
            announced={"worker-1": SimpleNamespace(h_seconds=9.5)},
            event=lambda name, **_: events.append(name),
        )

    step = 0.087  # seconds per batch
    assert not Estimation(run())._h_pays(slower, 15 * step)  # 1.3 s left: 0.2 s to save at most
    assert events == ["drift_ignored"]
    assert Estimation(run(rule="paper"))._h_pays(slower, 15 * step)  # the paper's rule: always
    assert Estimation(run())._h_pays(slower, 990 * step)  # 86 s left: up to 15 s to save
    assert not Estimation(run())._h_pays(slower, 590 * step)  # 51 s left: up to 9.0 s, under 9.5 s
    four_times = Drift("worker-1", 11, 20, measured=0.4, predicted=0.1)
    assert Estimation(run())._h_pays(four_times, 165 * 0.4)  # 66 s left: up to 49.5 s


def test_a_standing_gap_rescales_the_device_under_rule_rescale(trained: LatencyPredictor) -> None:
    device = _device(2.0, 1.0, 1e-3)
    h = [device(a, b) for a, b in representative(FLOPS)]
    times = DeviceTimes(trained, epsilon=0.1, drift="rescale")
    assert times.set_h("w1", h)
    predicted, other = times.predict("w1", 2, 5), times.predict("w1", 5, 8)
    assert predicted is not None and other is not None
    assert times.observe("w1", 2, 5, predicted * 1.05) is None and times.gaps == {}  # within epsilon
    assert times.close_gaps() == {}
    assert times.observe("w1", 2, 5, predicted * 3.0, load=1.5) is None  # 2x alone: a gap, not a drift
    assert times.gaps == {"w1": (2, 5)}
    applied = times.close_gaps()
    assert applied["w1"] == pytest.approx((2.0, 2.0))
    assert times.gaps == {}
    assert times.predict("w1", 2, 5) == pytest.approx(2.0 * predicted)  # the range as measured
    assert times.predict("w1", 5, 8) == pytest.approx(2.0 * other)  # every range of the device alike
    assert times.observe("w1", 2, 5, predicted * 3.0, load=1.5) is None and times.gaps == {}  # closed
    assert times.set_h("w1", [2 * v for v in h])  # a new h: measured anew, the rescale is dropped
    assert times.scale == {} and times.gaps == {}


def test_rule_changed_rescales_a_gross_gap_only(trained: LatencyPredictor) -> None:
    """Under the default rule a standing gap is the net's to close unless it is gross: at least GROSS_GAP
    times the prediction (or at most its inverse) and more than half a typical stage. A device rescaled for
    one is refined within epsilon after it, and its samples no longer fine-tune the net."""
    from edgeagent.predictor.tracker import GROSS_GAP

    device = _device(2.0, 1.0, 1e-3)
    h = [device(a, b) for a, b in representative(FLOPS)]
    times = DeviceTimes(trained, epsilon=0.1, drift="changed")
    assert times.set_h("w1", h) and times.set_h("w2", h)
    predicted = times.predict("w1", 2, 5)
    assert predicted is not None and GROSS_GAP == 2.0
    assert times.observe("w1", 2, 5, predicted * 1.9) is None and times.gaps == {}  # off, not gross
    # 3x, but a tiny stage beside typical ones of 10x its prediction: its overhead, not the device.
    assert times.observe("w1", 2, 5, predicted * 3.0, scale=10 * predicted) is None and times.gaps == {}
    assert times.observe("w1", 2, 5, predicted * 3.0, scale=predicted) is None  # gross: a gap, no drift
    assert times.observe("w2", 2, 5, predicted / 2.5, scale=predicted) is None  # gross the other way
    assert times.gaps == {"w1": (2, 5), "w2": (2, 5)}
    applied = times.close_gaps()
    assert applied["w1"] == pytest.approx((3.0, 3.0)) and applied["w2"] == pytest.approx((0.4, 0.4))
    # Rescaled: the next range is refined within epsilon, no longer only when gross.
    later = times.predict("w1", 2, 6)
    assert later is not None
    assert times.observe("w1", 2, 6, later * 1.3) is None and times.gaps == {"w1": (2, 6)}
    assert times.observe("w1", 2, 6, later * 1.05) is None and times.gaps == {}
    # The net is not fine-tuned on rescaled devices' samples: nothing else is news.
    assert times.adapt(steps=5) == 0
    assert times.set_h("w3", h)
    assert times.observe("w3", 2, 5, predicted * 1.5) is None
    assert times.adapt(steps=5) == 1


def test_a_rescale_is_checked_soon_after_but_not_forever() -> None:
    """After a re-plan for a standing gap the next plan check comes ``2 * repartition_first`` batches on,
    not ``repartition_every``; at most GAP_RECHECKS in a row, and a check without a gap resets the count."""
    from edgeagent.modes.pipeline.central.estimation import GAP_RECHECKS

    state = SimpleNamespace(recheck_at=None, rechecks=0, policy=SimpleNamespace(first=10))
    estimation = Estimation(state)  # type: ignore[arg-type]
    at = []
    for done in (10, 30, 50, 70):
        estimation.schedule_recheck(done, True)
        at.append(state.recheck_at)
    assert GAP_RECHECKS == 3 and at == [30, 50, 70, None]
    estimation.schedule_recheck(110, False)
    assert (state.recheck_at, state.rechecks) == (None, 0)
    estimation.schedule_recheck(210, True)
    assert state.recheck_at == 230
