"""Tests for edgeagent.splitfed.plan: PiPar's stage graph, eq. 14, and the choice of (P, N) per device."""

from __future__ import annotations

import random

import pytest

from edgeagent.splitfed.cost import (
    STAGES,
    Choice,
    DeviceCosts,
    LayerTimes,
    brute_force_critical_path,
    calibrate,
    critical_path,
    epoch_time,
    estimate_n,
    iteration_time,
    iterations_per_epoch,
    server_shares,
    stage_times,
)
from edgeagent.splitfed.plan import baseline, exhaustive, select

FWD = (0.02, 0.15, 0.10, 0.01, 0.002)  # a VGG-5-like device at the full batch
ACT = (2.5e5, 1.25e5, 2.3e4, 5.1e3, 4e2)


def _times(fwd: tuple[float, ...], scale: float = 1.0) -> LayerTimes:
    return LayerTimes(tuple(x * scale for x in fwd), tuple(2 * x * scale for x in fwd))


def _random_device(rng: random.Random, q: int) -> tuple[DeviceCosts, LayerTimes, tuple[float, ...]]:
    fwd = tuple(rng.uniform(0.0, 1.0) for _ in range(q))
    bwd = tuple(rng.uniform(0.0, 2.0) for _ in range(q))
    device = DeviceCosts("d", LayerTimes(fwd, bwd), rng.uniform(0.5, 5), rng.uniform(0.5, 5), 100)
    server = LayerTimes(
        tuple(rng.uniform(0, 1) for _ in range(q)), tuple(rng.uniform(0, 1) for _ in range(q))
    )
    act = tuple(rng.uniform(0.0, 3.0) for _ in range(q))
    return device, server, act


@pytest.mark.parametrize("n", range(1, 7))
def test_critical_path_equals_brute_force_on_random_graphs(n: int) -> None:
    rng = random.Random(n)
    for _ in range(25):
        # Stage times that differ between mini-batches too, so every edge of the graph matters.
        stages = [{key: rng.choice([0.0, rng.uniform(0, 1)]) for key in STAGES} for _ in range(n)]
        assert critical_path(stages) == pytest.approx(brute_force_critical_path(stages), abs=1e-12)


@pytest.mark.parametrize("n", range(1, 7))
def test_iteration_time_equals_brute_force(n: int) -> None:
    rng = random.Random(100 + n)
    for _ in range(20):
        q = rng.randint(1, 5)
        device, server, act = _random_device(rng, q)
        choice = Choice(rng.randint(1, q), n)
        share = rng.uniform(0.2, 1.0)
        memo = iteration_time(device, server, act, act, choice, server_share=share)
        brute = iteration_time(
            device, server, act, act, choice, server_share=share, path=brute_force_critical_path
        )
        assert memo == pytest.approx(brute, abs=1e-12)


def test_one_mini_batch_runs_its_stages_in_sequence() -> None:
    stages = [{"f_c": 1.0, "u": 2.0, "f_s": 3.0, "b_s": 4.0, "d": 5.0, "b_c": 6.0}]
    assert critical_path(stages) == 21.0


def test_two_mini_batches_by_hand() -> None:
    # f1 0-1, f2 1-2; u1 1-3, u2 3-5; server 3-4 and 5-6; d1 4-5, d2 6-7; b1 5-6, b2 7-8.
    st = {"f_c": 1.0, "u": 2.0, "f_s": 0.5, "b_s": 0.5, "d": 1.0, "b_c": 1.0}
    assert critical_path([st, st]) == 8.0


def test_linear_in_n_two_hundred_mini_batches() -> None:
    # The uplink is the bottleneck: T = f_c + N u + f_s + b_s + d + b_c. An exponential recursion (PiPar's
    # code) would not return for N = 200.
    st = {"f_c": 0.01, "u": 1.0, "f_s": 0.1, "b_s": 0.2, "d": 0.3, "b_c": 0.01}
    assert critical_path([st] * 200) == pytest.approx(0.01 + 200 * 1.0 + 0.1 + 0.2 + 0.3 + 0.01)
    device = DeviceCosts("d", _times(FWD), 1e5, 1e5, 1000)
    assert iteration_time(device, _times(FWD, 0.5), ACT, ACT, Choice(1, 200)) > 0


def test_stage_times_follow_eq_5_to_10() -> None:
    device = DeviceCosts("d", _times(FWD), up_bps=1e5, down_bps=2e5, samples=100)
    server = _times(FWD, 0.1)
    st = stage_times(device, server, ACT, ACT, Choice(2, 4))
    assert st["f_c"] == pytest.approx((0.02 + 0.15) / 4)
    assert st["b_c"] == pytest.approx(2 * (0.02 + 0.15) / 4)
    assert st["f_s"] == pytest.approx(0.1 * (0.10 + 0.01 + 0.002) / 4)
    assert st["u"] == pytest.approx(1.25e5 / 1e5 / 4)
    assert st["d"] == pytest.approx(1.25e5 / 2e5 / 4)
    # floor(B/N) when B is given, a shared server, and nothing on the link when P = Q.
    exact = stage_times(device, server, ACT, ACT, Choice(2, 3), batch_size=10, server_share=0.5)
    assert exact["f_c"] == pytest.approx((0.02 + 0.15) * 3 / 10)
    assert exact["f_s"] == pytest.approx(0.1 * (0.10 + 0.01 + 0.002) * 3 / 10 / 0.5)
    whole = stage_times(device, server, ACT, ACT, Choice(5, 1))
    assert whole["u"] == whole["f_s"] == whole["b_s"] == whole["d"] == 0.0


def test_fixed_parts_and_latency_do_not_shrink_with_n() -> None:
    times = LayerTimes((1.0,) * 2, (2.0,) * 2, fwd_fixed=(0.5, 0.5), bwd_fixed=(0.0, 0.0))
    device = DeviceCosts("d", times, 10.0, 10.0, 100, latency_s=0.25)
    st = stage_times(device, times, (10.0, 10.0), (10.0, 10.0), Choice(1, 2))
    assert st["f_c"] == pytest.approx(0.5 + 0.5 / 2)
    assert st["u"] == pytest.approx(10.0 / 10.0 / 2) and st["lu"] == st["ld"] == 0.25


def test_latency_is_in_flight_once_not_per_mini_batch() -> None:
    """A link's per-message latency delays each mini-batch but does not hold the link: with the uplink
    the bottleneck, N uploads take N x their bytes' time plus one latency, not N latencies."""
    st = {"f_c": 0.01, "u": 1.0, "lu": 0.5, "f_s": 0.1, "b_s": 0.2, "d": 0.3, "ld": 0.5, "b_c": 0.01}
    n = 50
    assert critical_path([st] * n) == pytest.approx(0.01 + n * 1.0 + 0.5 + 0.1 + 0.2 + 0.3 + 0.5 + 0.01)
    assert critical_path([st] * 4) == pytest.approx(brute_force_critical_path([st] * 4))


def test_eq_14_on_a_hand_example() -> None:
    # Split after layer 1: f^c 1, b^c 2; u = 4/2 = 2, d = 4/4 = 1; server f 0.5+0.5, b 1+1.
    device = DeviceCosts(
        "d", LayerTimes((1.0, 3.0, 3.0), (2.0, 3.0, 3.0)), up_bps=2.0, down_bps=4.0, samples=10
    )
    server = LayerTimes((9.0, 0.5, 0.5), (9.0, 1.0, 1.0))
    act = (4.0, 100.0, 100.0)
    # N = 1 + ceil((2 + 1 + 2 + 1) / min(1, 2)) = 7
    assert estimate_n(device, server, act, act, 1) == 7
    assert estimate_n(device, server, act, act, 1, batch_size=5) == 5
    # On half the server the idle time is 2 + 2 + 4 + 1: N = 10.
    assert estimate_n(device, server, act, act, 1, server_share=0.5) == 10
    assert estimate_n(device, server, act, act, 3) == 1  # FL: nothing to wait for


def test_iterations_per_epoch_use_floor_of_b_over_n() -> None:
    assert iterations_per_epoch(1000, 100, 1) == 10
    assert iterations_per_epoch(1000, 100, 3) == 1000 // 99
    assert iterations_per_epoch(50, 100, 1) == 0


def _two_devices(server_speed: float = 2.0) -> tuple[list[DeviceCosts], LayerTimes]:
    devices = [
        DeviceCosts("slow", _times(FWD, 2), 1e6, 1e6, 1000),
        DeviceCosts("fast", _times(FWD), 1e6, 1e6, 1000),
    ]
    return devices, _times(FWD, 1 / server_speed)


def test_fl_and_sfl_baselines() -> None:
    devices, server = _two_devices()
    fl = baseline("fl", devices, server, ACT, ACT, 20)
    assert fl == {"slow": Choice(5, 1), "fast": Choice(5, 1)}
    sfl = baseline("sfl", devices, server, ACT, ACT, 20)
    assert {c.n for c in sfl.values()} == {1} and len(set(sfl.values())) == 1
    best = min(
        range(1, 6),
        key=lambda p: epoch_time(devices, server, ACT, ACT, 20, {d.name: Choice(p, 1) for d in devices}),
    )
    assert sfl["slow"].split == best
    capped = [DeviceCosts("small", _times(FWD), 1e6, 1e6, 100, max_layers=2)]
    with pytest.raises(ValueError, match="whole model"):
        baseline("fl", capped, server, ACT, ACT, 20)


def test_per_device_choice_beats_the_best_common_one() -> None:
    devices, server = _two_devices()
    ours = select(devices, server, ACT, ACT, 20)
    assert ours["slow"] != ours["fast"]
    common = exhaustive(devices, server, ACT, ACT, 20)
    assert len(set(common.values())) == 1
    t_ours = epoch_time(devices, server, ACT, ACT, 20, ours)
    assert t_ours < epoch_time(devices, server, ACT, ACT, 20, common)
    assert select(devices, server, ACT, ACT, 20, per_device=False) == common


def test_ours_is_never_worse_than_the_paper_by_the_estimate() -> None:
    rng = random.Random(7)
    for _ in range(4):
        speeds = [rng.uniform(1, 3) for _ in range(3)]
        devices = [
            DeviceCosts(f"d{i}", _times(FWD, s), rng.uniform(1e5, 1e6), rng.uniform(1e5, 1e6), 500)
            for i, s in enumerate(speeds)
        ]
        server = _times(FWD, rng.uniform(0.1, 0.6))
        paper = select(devices, server, ACT, ACT, 16, method="paper")
        ours = select(devices, server, ACT, ACT, 16)
        assert epoch_time(devices, server, ACT, ACT, 16, ours) <= epoch_time(
            devices, server, ACT, ACT, 16, paper
        )


def test_paper_rule_takes_eq_14_n_for_its_split() -> None:
    devices, server = _two_devices()
    paper = select(devices, server, ACT, ACT, 20, method="paper")
    for d in devices:
        c = paper[d.name]
        assert c.n == estimate_n(d, server, ACT, ACT, c.split, batch_size=20)


def test_memory_limit_caps_the_split() -> None:
    devices = [DeviceCosts("pi", _times(FWD), 1e8, 1e8, 1000, max_layers=2)]
    server = _times(FWD, 10.0)  # a server slower than the device: the device would take everything
    for method in ("ours", "paper"):
        assert select(devices, server, ACT, ACT, 20, method=method)["pi"].split <= 2
    with pytest.raises(ValueError, match="split 3 not in"):
        iteration_time(devices[0], server, ACT, ACT, Choice(3, 1))


def test_contention_shares_the_server() -> None:
    devices, server = _two_devices(server_speed=1.0)
    choices = {d.name: Choice(1, 4) for d in devices}
    shares = server_shares(devices, server, ACT, ACT, 20, choices)
    assert all(0.5 <= s < 1.0 for s in shares.values())
    assert server_shares(devices[:1], server, ACT, ACT, 20, choices) == {"slow": 1.0}
    alone = epoch_time(devices, server, ACT, ACT, 20, choices, contention=False)
    assert epoch_time(devices, server, ACT, ACT, 20, choices) > alone


def test_bad_input_is_refused_with_the_numbers() -> None:
    with pytest.raises(ValueError, match="one length"):
        LayerTimes((1.0,), (1.0, 2.0))
    with pytest.raises(ValueError, match=">= 0"):
        LayerTimes((-1.0,), (1.0,))
    with pytest.raises(ValueError, match="bandwidths"):
        DeviceCosts("d", _times(FWD), 0.0, 1.0, 10)
    with pytest.raises(ValueError, match="split >= 1"):
        Choice(0, 1)
    device = DeviceCosts("d", _times(FWD), 1.0, 1.0, 10)
    with pytest.raises(ValueError, match="act_bytes 2"):
        stage_times(device, _times(FWD), (1.0, 2.0), ACT, Choice(1, 1))
    with pytest.raises(ValueError, match="exceeds the batch size 4"):
        stage_times(device, _times(FWD), ACT, ACT, Choice(1, 5), batch_size=4)


def test_calibrate_scales_the_device_to_what_it_measured() -> None:
    """After calibration the estimate of the measured epoch's compute is what was measured; every layer
    (fixed parts too) scales alike, so the ranking of (P, N) by compute alone is kept."""
    times = LayerTimes((0.4, 0.2, 0.1), (0.4, 0.2, 0.1), (0.01, 0.0, 0.0), (0.02, 0.0, 0.0))
    device = DeviceCosts("w", times, 1e6, 1e6, 400)
    choice, batch, iterations = Choice(2, 4), 100, 4

    def compute(d: DeviceCosts, c: Choice) -> float:
        st = stage_times(d, times, (1.0,) * 3, (1.0,) * 3, c, batch_size=batch)
        return iterations * c.n * (st["f_c"] + st["b_c"])

    estimated = compute(device, choice)
    for measured in (1.3 * estimated, 0.5 * estimated):
        fixed = calibrate(device, choice, batch, measured, iterations)
        assert compute(fixed, choice) == pytest.approx(measured)
        ratio = measured / estimated
        assert fixed.times.fwd == pytest.approx(tuple(ratio * t for t in times.fwd))
        assert fixed.times.bwd_fixed == pytest.approx(tuple(ratio * t for t in times.bwd_fixed))
        for other in (Choice(1, 1), Choice(3, 8)):
            assert compute(fixed, other) == pytest.approx(ratio * compute(device, other))
    assert calibrate(device, choice, batch, 0.0, iterations) is device
    assert calibrate(device, choice, batch, 1.0, 0) is device
