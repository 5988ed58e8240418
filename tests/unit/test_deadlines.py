"""Deadlines derived from measurements (planner/deadlines.py) and the compression widths they sit beside."""

from __future__ import annotations

import pytest

from edgeagent.compression import adaptive_schedule, link_bits
from edgeagent.planner.deadlines import Deadlines


def test_batch_timer_follows_the_measured_step_above_its_floor() -> None:
    d = Deadlines(multiplier=4.0, batch_floor=10.0, probe_floor=1.0)
    assert d.batch(0.001, stages=3, bound=3) == 10.0  # a fast laptop cluster: the floor
    # A Pi stage of 3.6 s per batch, 3 in flight: 3 x 3.6 x 4.
    assert d.batch(3.6, stages=3, bound=3) == pytest.approx(43.2)
    # More in flight than stages: a batch waits behind all of them.
    assert d.batch(1.0, stages=3, bound=8) == pytest.approx(32.0)
    assert d.batch(1.0, stages=5, bound=2) == pytest.approx(20.0)


def test_a_fixed_ten_second_timer_would_trip_on_a_sixty_times_slower_device() -> None:
    # The reproduction: MobileNetV2 stages of ~60 ms here, 60x slower on the slow devices.
    step = 0.06 * 60
    assert step * 3 > 10.0  # what a batch really takes with three in flight
    assert Deadlines().batch(step, stages=3, bound=3) > step * 3


def test_evaluation_deadline_scales_with_the_chunk_and_the_probe_with_the_slowest_stage() -> None:
    d = Deadlines(multiplier=2.0, batch_floor=1.0, probe_floor=0.5)
    # 256-sample chunks against 32-sample training batches: 4x a training step's share per stage.
    assert d.evaluation(1.0, stages=3, bound=3, eval_batch=256, train_batch=32) == pytest.approx(24.0)
    assert d.evaluation(1.0, stages=3, bound=3, eval_batch=16, train_batch=32) == pytest.approx(6.0)
    assert d.probe(0.01, 0.01) == 0.5
    assert d.probe(5.0, 0.2) == pytest.approx(10.4)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_deadlines_refuse_nonsense(bad: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        Deadlines(multiplier=bad)
    with pytest.raises(ValueError, match="predicted time"):
        Deadlines().batch(bad if bad != 0.0 else -1.0, stages=1, bound=1)


def test_adaptive_widths_drop_the_gradients_to_four_bits_late_in_the_run() -> None:
    s = adaptive_schedule(5)
    assert [s.forward_bits(e) for e in range(5)] == [2, 3, 3, 4, 4]
    assert [s.backward_bits(e) for e in range(5)] == [8, 8, 8, 8, 4]
    paper = adaptive_schedule(200)  # MobileNetV2 in the paper: 8 -> 4 at epoch 160
    assert paper.backward_bits(159) == 8 and paper.backward_bits(160) == 4


def test_auto_widths_pick_four_bit_gradients_on_a_link_too_slow_for_eight() -> None:
    size = 4_000_000  # bytes of float32 activations
    assert link_bits(1e12, size, 0.1) == (32, 32)  # a fast link: nothing to compress
    assert link_bits(size * 8 / 32 / 0.1, size, 0.1) == (4, 8)  # 8-bit gradients just fit
    assert link_bits(size * 4 / 32 / 0.1, size, 0.1) == (4, 4)  # only 4-bit ones do
    assert link_bits(1.0, size, 0.1) == (2, 4)  # hopeless: the narrowest of each


def test_replicas_queued_on_a_slow_uplink_extend_the_batch_timer_beyond_the_floor() -> None:
    """At a replication point a stage's weights and momentum go out on the same uplink as its gradients:
    on a 0.5 Mbit/s link a gradient can wait seconds behind them (the compression benchmark's 0.5 Mbit/s
    run took a live worker for dead at the 10 s floor). That wait is added, not scaled or floored away."""
    d = Deadlines(multiplier=4.0, batch_floor=10.0)
    assert d.batch(0.5, stages=3, bound=3) == 10.0
    assert d.batch(0.5, stages=3, bound=3, queued=7.5) == 17.5
    assert d.batch(5.0, stages=3, bound=3, queued=7.5) == 4.0 * 15.0 + 7.5
    with pytest.raises(ValueError, match="queued"):
        d.batch(0.5, stages=3, bound=3, queued=-1.0)


def test_a_requested_measurement_may_take_the_multiplier_times_the_last_one_above_the_floor() -> None:
    d = Deadlines(multiplier=4.0, batch_floor=10.0)
    assert d.measurement(0.0) == 10.0  # never measured: the floor
    assert d.measurement(2.0) == 10.0
    assert d.measurement(9.5) == 38.0  # a slow Pi's 9.5 s measurement is not a fault
    with pytest.raises(ValueError):
        d.measurement(float("nan"))
