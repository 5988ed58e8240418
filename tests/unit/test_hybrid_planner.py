"""The hybrid planner: stages held by several devices (edgeagent.planner.hybrid)."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import pytest

from edgeagent.planner import dp
from edgeagent.planner.hybrid import (
    Device,
    HybridPlan,
    HybridProblem,
    all_plans,
    brute_force_hybrid,
    capacity_bound,
    fits_hybrid,
    plan_shares,
    predict_hybrid,
)
from edgeagent.planner.hybrid_dp import solve_hybrid
from edgeagent.planner.partition import check_points


def random_device(rng: random.Random, pool: list[Device], ties: bool) -> Device:
    """A device, often a copy of one already drawn (identical devices are one type to the DP)."""
    if pool and rng.random() < 0.4:
        return rng.choice(pool)
    if ties:
        return Device(
            capacity=rng.choice([0.5, 1.0, 2.0, 4.0]),
            bandwidth=rng.choice([math.inf, 1000.0, 4000.0]),
            latency=rng.choice([0.0, 0.5]),
        )
    return Device(
        capacity=rng.uniform(0.3, 6.0),
        bandwidth=rng.choice([math.inf, 10 ** rng.uniform(3, 5)]),
        latency=rng.choice([0.0, rng.uniform(0.0, 0.3)]),
    )


def with_limits(rng: random.Random, p: HybridProblem) -> HybridProblem:
    """Random memory limits around what a stage of the average size needs."""
    params = tuple(rng.randint(1, 5_000) for _ in range(p.num_layers))
    typical = (sum(params) * 6 + 3 * sum(p.output_bytes)) / 2
    devices = tuple(
        replace(d, memory_limit=rng.choice([None, typical * rng.uniform(0.2, 2.0)])) for d in p.devices
    )
    return replace(p, param_bytes=params, devices=devices)


def random_problem(
    rng: random.Random, *, ties: bool, max_devices: int = 5, max_layers: int = 6
) -> HybridProblem:
    num_layers = rng.randint(1, max_layers)
    pool: list[Device] = []
    for _ in range(rng.randint(1, max_devices)):
        pool.append(random_device(rng, pool, ties))
    if ties:
        times = tuple(float(rng.randint(1, 3)) for _ in range(num_layers))
        sizes = tuple(rng.choice([0, 1000, 2000]) for _ in range(num_layers))
    else:
        times = tuple(rng.uniform(0.05, 3.0) for _ in range(num_layers))
        sizes = tuple(rng.randint(0, 20_000) for _ in range(num_layers))
    p = HybridProblem(
        layer_times=times,
        output_bytes=sizes,
        devices=tuple(pool),
        in_flight=rng.choice([0, 0, 1, 2, 3]),
        activation_factor=rng.choice([1.0, 0.5]),
        max_replicas=rng.choice([None, None, 1, 2]),
    )
    roll = rng.random()
    if roll < 0.3:
        return with_limits(rng, p)
    if roll < 0.6:
        return replace(p, param_bytes=tuple(rng.choice([0, 500, 3000]) for _ in range(num_layers)))
    return p


def check_valid(p: HybridProblem, plan: HybridPlan) -> None:
    check_points(plan.points, p.num_layers)
    assert plan.groups[0] == (0,)
    used = [d for g in plan.groups for d in g]
    assert len(used) == len(set(used)) and all(0 <= d < p.num_devices for d in used)
    assert all(list(g) == sorted(g) and g for g in plan.groups)
    assert fits_hybrid(p, plan.points, plan.groups)
    assert plan.time == predict_hybrid(p, plan.points, plan.groups)
    assert plan.shares == plan_shares(p, plan.groups)


# --------------------------------------------------------------------------------------------------
# Exactness


def test_solve_equals_brute_force_on_random_instances() -> None:
    rng = random.Random(2025)
    infeasible = replicated = left_out = shared_optimum = 0
    for case in range(300):
        p = random_problem(rng, ties=case % 2 == 0)
        try:
            expected = brute_force_hybrid(p)
        except ValueError as error:
            assert "fits the memory limits" in str(error)
            infeasible += 1
            with pytest.raises(ValueError, match="fits the memory limits"):
                solve_hybrid(p)
            continue
        got = solve_hybrid(p)
        check_valid(p, got)
        assert got == expected, (case, p)
        replicated += bool(got.replicated)
        left_out += bool(got.unused(p.num_devices))
        if case % 2 == 0 and p.num_devices >= 3:
            optimal = sum(
                1
                for points, groups in all_plans(p)
                if fits_hybrid(p, points, groups) and predict_hybrid(p, points, groups) == got.time
            )
            shared_optimum += optimal > 1
    assert infeasible >= 5 and replicated >= 30 and left_out >= 30 and shared_optimum >= 20, (
        infeasible,
        replicated,
        left_out,
        shared_optimum,
    )


def test_brute_force_sees_every_plan() -> None:
    p = HybridProblem(layer_times=(1.0,) * 3, output_bytes=(0,) * 3, devices=(Device(1.0),) * 3)
    plans = list(all_plans(p))
    # 1 stage; 2 stages: 2 cuts x 3 non-empty worker sets; 3 stages: 1 cut pair x 2 orders.
    assert len(plans) == 1 + 2 * 3 + 2
    assert len(set(plans)) == len(plans)


def test_singleton_groups_reduce_to_dp_predict_and_fits() -> None:
    rng = random.Random(11)
    for case in range(300):
        p = random_problem(rng, ties=case % 3 == 0, max_devices=6, max_layers=8)
        n = rng.randint(1, min(p.num_devices, p.num_layers))
        points = [0, *sorted(rng.sample(range(1, p.num_layers), n - 1)), p.num_layers]
        order = [0, *rng.sample(range(1, p.num_devices), n - 1)]
        devices = [p.devices[d] for d in order]
        links = tuple(
            dp.Link(min(a.bandwidth, b.bandwidth), max(a.latency, b.latency))
            for a, b in itertools.pairwise(devices)
        )
        limits = tuple(d.memory_limit for d in devices)
        reference = dp.Problem(
            layer_times=p.layer_times,
            output_bytes=p.output_bytes,
            capacities=tuple(d.capacity for d in devices),
            links=links,
            param_bytes=p.param_bytes,
            memory_limits=limits if any(m is not None for m in limits) else None,
            in_flight=p.in_flight,
            activation_factor=p.activation_factor,
        )
        groups = [(d,) for d in order]
        assert predict_hybrid(p, points, groups) == dp.predict(reference, points), (case, p)
        assert fits_hybrid(p, points, groups) == dp.fits(reference, points), (case, p)


def test_never_worse_than_the_dp_on_all_devices_in_order() -> None:
    rng = random.Random(5)
    for _ in range(40):
        p = random_problem(rng, ties=False, max_devices=7, max_layers=12)
        n = min(p.num_devices, p.num_layers)
        devices = p.devices[:n]
        reference = dp.Problem(
            layer_times=p.layer_times,
            output_bytes=p.output_bytes,
            capacities=tuple(d.capacity for d in devices),
            links=tuple(
                dp.Link(min(a.bandwidth, b.bandwidth), max(a.latency, b.latency))
                for a, b in itertools.pairwise(devices)
            ),
            param_bytes=p.param_bytes,
            memory_limits=tuple(d.memory_limit for d in devices),
            in_flight=p.in_flight,
            activation_factor=p.activation_factor,
        )
        try:
            baseline = dp.predict(reference, dp.solve(reference))
        except ValueError:
            continue
        plan = solve_hybrid(p)
        check_valid(p, plan)
        assert plan.time <= baseline * (1 + 1e-12)


# --------------------------------------------------------------------------------------------------
# Behaviour


def test_more_devices_than_layers_replicates_stages() -> None:
    p = HybridProblem(
        layer_times=(1.0, 4.0),
        output_bytes=(100, 100),
        devices=(Device(1.0),) + (Device(1.0, bandwidth=1e9),) * 5,
        param_bytes=(10, 10),
    )
    plan = solve_hybrid(p)
    check_valid(p, plan)
    assert plan.points == (0, 1, 2)
    # Four replicas give 4.0 / 4 plus a tiny gradient exchange, just above the central node's 1.0.
    assert plan.groups == ((0,), (1, 2, 3, 4, 5))
    assert plan.replicated == (1,) and plan.unused(6) == ()
    assert plan.time == 1.0
    assert plan == brute_force_hybrid(p)
    # With a slower central node (3.0 s) two replicas (2.0 s) are enough: fewest devices.
    slow = replace(p, devices=(Device(3.0), *p.devices[1:]))
    plan = solve_hybrid(slow)
    assert plan.groups == ((0,), (1, 2)) and plan.time == 3.0
    assert plan.unused(6) == (3, 4, 5)
    assert plan == brute_force_hybrid(slow)


def test_very_slow_device_is_left_out() -> None:
    p = HybridProblem(
        layer_times=(1.0,) * 6,
        output_bytes=(10,) * 6,
        devices=(Device(1.0), Device(1.0), Device(1000.0), Device(1.0)),
    )
    plan = solve_hybrid(p)
    check_valid(p, plan)
    assert 2 in plan.unused(p.num_devices)
    assert plan.time == 2.0
    assert plan == brute_force_hybrid(p)


def test_no_replication_when_the_gradient_exchange_costs_more_than_it_saves() -> None:
    devices = (Device(1.0),) + (Device(1.0, bandwidth=1e6),) * 3
    base = HybridProblem(
        layer_times=(1.0, 3.0),
        output_bytes=(1, 1),
        devices=devices,
        param_bytes=(0, 1_000_000),  # r * P / B = 2 s for two replicas of layer 1
    )
    plan = solve_hybrid(base)
    assert plan.replicated == ()
    assert plan.time == 3.0  # two replicas: 3.0 / 2 + 2.0 = 3.5; three: 1.0 + 3.0
    cheap = replace(base, param_bytes=(0, 100_000))  # three replicas: 1.0 + 0.3
    plan = solve_hybrid(cheap)
    assert plan.groups == ((0,), (1, 2, 3))
    assert plan.time == pytest.approx(1.3, rel=1e-6)
    for p in (base, cheap):
        assert solve_hybrid(p) == brute_force_hybrid(p)
    # Equal fast devices and free links, but every layer's parameters take longer to exchange than the
    # whole model takes to compute: replicating never pays.
    rng = random.Random(9)
    for _ in range(30):
        num_layers = rng.randint(1, 10)
        times = tuple(rng.uniform(0.1, 1.0) for _ in range(num_layers))
        p = HybridProblem(
            layer_times=times,
            output_bytes=tuple(rng.randint(0, 1000) for _ in range(num_layers)),
            devices=(Device(1.0, bandwidth=1e12),) * rng.randint(2, 7),
            param_bytes=tuple(int(sum(times) * 1e7) + 1 for _ in range(num_layers)),
        )
        p = replace(p, devices=tuple(replace(d, bandwidth=1e7) if i else d for i, d in enumerate(p.devices)))
        plan = solve_hybrid(p)
        check_valid(p, plan)
        assert plan.replicated == ()


def test_shares_follow_speed() -> None:
    p = HybridProblem(
        layer_times=(1.0,) * 3,
        output_bytes=(0,) * 3,
        devices=(Device(1.0), Device(1.0), Device(2.0), Device(4.0)),
    )
    shares = plan_shares(p, [(0,), (1, 2, 3)])
    assert shares[0] == (1.0,)
    assert shares[1] == pytest.approx((4 / 7, 2 / 7, 1 / 7), rel=1e-12)
    assert math.fsum(shares[1]) == pytest.approx(1.0, rel=1e-12)
    # Compute of a group is T * C_G with C_G = 1 / sum(1 / C_d).
    assert predict_hybrid(p, (0, 1, 3), [(0,), (1, 2, 3)]) == pytest.approx(2.0 * 4 / 7)
    rng = random.Random(3)
    for _ in range(100):
        caps = [rng.uniform(0.1, 10.0) for _ in range(rng.randint(2, 6))]
        q = replace(p, devices=tuple(Device(c) for c in caps))
        group = tuple(range(1, len(caps)))
        got = plan_shares(q, [(0,), group])[1]
        assert math.fsum(got) == pytest.approx(1.0, rel=1e-12)
        for d, share in zip(group, got, strict=True):
            assert share * caps[d] == pytest.approx(got[0] * caps[1], rel=1e-12)


def test_a_plan_running_with_older_shares_is_paced_by_its_member_slowest_for_its_share() -> None:
    p = HybridProblem(
        layer_times=(1.0,) * 3,
        output_bytes=(0,) * 3,
        devices=(Device(1.0), Device(1.0), Device(2.0), Device(4.0)),
    )
    groups = [(0,), (1, 2, 3)]
    best = predict_hybrid(p, (0, 1, 3), groups)
    assert predict_hybrid(p, (0, 1, 3), groups, plan_shares(p, groups)) == pytest.approx(best, rel=1e-12)
    # Equal thirds: device 3 (capacity 4) takes 2 layers x 4 x 1/3 per batch, the others wait for it.
    equal = ((1.0,), (1 / 3, 1 / 3, 1 / 3))
    assert predict_hybrid(p, (0, 1, 3), groups, equal) == pytest.approx(2.0 * 4 / 3)
    assert predict_hybrid(p, (0, 1, 3), groups, equal) > best
    with pytest.raises(ValueError, match="do not match"):
        predict_hybrid(p, (0, 1, 3), groups, ((1.0,), (0.5, 0.5)))


def test_link_costs_every_receiver_and_the_slowest_sender_share() -> None:
    p = HybridProblem(
        layer_times=(1.0, 1.0),
        output_bytes=(1000, 0),
        devices=(
            Device(1.0, bandwidth=1000.0),
            Device(1.0, bandwidth=500.0, latency=0.1),
            Device(3.0, bandwidth=2000.0),
        ),
    )
    # Shares of (1, 2): 3/4 and 1/4. Forward: receivers download all 1000 bytes -> 1000 / 500 = 2 s;
    # backward: senders 1000 * 3/4 / 500 = 1.5 s and 1000 / 4 / 2000; the central node downloads 1 s.
    got = predict_hybrid(p, (0, 1, 2), [(0,), (1, 2)])
    assert got == pytest.approx((2.0 + 0.1) + (1.5 + 0.1))


def test_central_node_and_replicas_respect_memory() -> None:
    p = HybridProblem(
        layer_times=(1.0,) * 4,
        output_bytes=(0,) * 4,
        devices=(Device(1.0, memory_limit=1000.0), Device(1.0), Device(1.0, memory_limit=100.0)),
        param_bytes=(100,) * 4,
        in_flight=1,
    )
    # f = 1 on every stage: 4 * P bytes; device 2 holds at most 25 bytes of parameters, i.e. nothing.
    plan = solve_hybrid(p)
    assert 2 not in [d for g in plan.groups for d in g]
    assert not fits_hybrid(p, (0, 2, 4), [(0,), (1, 2)])
    assert fits_hybrid(p, (0, 2, 4), [(0,), (1,)])
    assert plan == brute_force_hybrid(p)


def test_infeasible_memory_raises() -> None:
    p = HybridProblem(
        layer_times=(1.0,) * 3,
        output_bytes=(10,) * 3,
        devices=(Device(1.0, memory_limit=50.0), Device(1.0, memory_limit=50.0)),
        param_bytes=(100,) * 3,
    )
    with pytest.raises(ValueError, match=r"fits the memory limits \[50\.0, 50\.0\].*raise the memory"):
        solve_hybrid(p)
    with pytest.raises(ValueError, match="fits the memory limits"):
        brute_force_hybrid(p)


def test_times_within_the_tolerance_are_ties() -> None:
    p = HybridProblem(
        layer_times=(0.1, 0.2, 0.3), output_bytes=(0,) * 3, devices=(Device(1.0),) * 3, max_replicas=1
    )
    assert predict_hybrid(p, (0, 2, 3), [(0,), (1,)]) == 0.1 + 0.2 > 0.3
    assert predict_hybrid(p, (0, 1, 2, 3), [(0,), (1,), (2,)]) == 0.3
    # 0.30000000000000004 is within 1e-12 of 0.3: the plan with fewer devices wins.
    plan = solve_hybrid(p)
    assert plan.points == (0, 2, 3) and plan.groups == ((0,), (1,))
    assert plan.time == 0.1 + 0.2
    assert plan == brute_force_hybrid(p)


def test_plan_helpers() -> None:
    plan = HybridPlan((0, 1, 3), ((0,), (2, 4)), ((1.0,), (0.5, 0.5)), 1.0)
    assert plan.num_stages == 2
    assert plan.replicated == (1,)
    assert plan.used() == (0, 2, 4)
    assert plan.unused(6) == (1, 3, 5)
    with pytest.raises(ValueError, match="stage 0 must be the central node"):
        HybridPlan((0, 1), ((1,),), ((1.0,),), 1.0)
    with pytest.raises(ValueError, match="2 shares for 1 devices"):
        HybridPlan((0, 1, 2), ((0,), (1,)), ((1.0,), (0.5, 0.5)), 1.0)


# --------------------------------------------------------------------------------------------------
# Validation


def test_device_and_problem_validation() -> None:
    for bad in (0.0, -1.0, math.nan, math.inf, 1e-320):
        with pytest.raises(ValueError, match="capacity"):
            Device(bad)
    with pytest.raises(ValueError, match="bandwidth 0"):
        Device(1.0, bandwidth=0.0)
    with pytest.raises(ValueError, match="latency -1"):
        Device(1.0, latency=-1.0)
    with pytest.raises(ValueError, match="memory_limit -5"):
        Device(1.0, memory_limit=-5.0)
    lists: dict[str, list[object]] = {
        "layer_times": [1.0, 2.0],
        "output_bytes": [1, 2],
        "devices": [Device(1.0)],
    }
    ok = HybridProblem(**lists)  # type: ignore[arg-type]  # lists are converted to tuples
    assert ok.devices == (Device(1.0),) and ok.layer_times == (1.0, 2.0)
    with pytest.raises(ValueError, match="at least 1 device"):
        replace(ok, devices=())
    with pytest.raises(ValueError, match="3 output sizes for 2 layers"):
        replace(ok, output_bytes=(1, 2, 3))
    with pytest.raises(ValueError, match=r"layer_times\[1\] = -2"):
        replace(ok, layer_times=(1.0, -2.0))
    with pytest.raises(ValueError, match="1 parameter sizes for 2 layers"):
        replace(ok, param_bytes=(1,))
    with pytest.raises(ValueError, match="max_replicas 0"):
        replace(ok, max_replicas=0)
    with pytest.raises(ValueError, match="in_flight -1"):
        replace(ok, in_flight=-1)


def test_plan_validation() -> None:
    p = HybridProblem(
        layer_times=(1.0,) * 3, output_bytes=(1,) * 3, devices=(Device(1.0),) * 4, max_replicas=2
    )
    with pytest.raises(ValueError, match=r"stage 0 must be the central node \(device 0\) alone"):
        predict_hybrid(p, (0, 1, 3), [(1,), (2,)])
    with pytest.raises(ValueError, match=r"stage 0 must be the central node"):
        predict_hybrid(p, (0, 1, 3), [(0, 1), (2,)])
    with pytest.raises(ValueError, match="device 2 holds more than one stage"):
        predict_hybrid(p, (0, 1, 2, 3), [(0,), (1, 2), (2, 3)])
    with pytest.raises(ValueError, match="device 0 holds more than one stage"):
        fits_hybrid(p, (0, 1, 3), [(0,), (0, 1)])
    with pytest.raises(ValueError, match=r"device 7 in stage 1 is outside 0\.\.3"):
        predict_hybrid(p, (0, 1, 3), [(0,), (7,)])
    with pytest.raises(ValueError, match="must be ascending"):
        predict_hybrid(p, (0, 1, 3), [(0,), (2, 1)])
    with pytest.raises(ValueError, match="stage 1 has no device"):
        plan_shares(p, [(0,), ()])
    with pytest.raises(ValueError, match="3 devices, more than max_replicas 2"):
        predict_hybrid(p, (0, 1, 3), [(0,), (1, 2, 3)])
    with pytest.raises(ValueError, match="give 2 stages, 3 groups"):
        predict_hybrid(p, (0, 1, 3), [(0,), (1,), (2,)])
    with pytest.raises(ValueError, match="must increase"):
        predict_hybrid(p, (0, 1, 1, 3), [(0,), (1,), (2,)])


# --------------------------------------------------------------------------------------------------
# Size


def test_eight_devices_and_twenty_five_layers() -> None:
    rng = random.Random(8)
    central = Device(1.0, bandwidth=1e8, latency=0.001)
    fast, slow = Device(1.0, 1e7, 0.005), Device(4.0, 5e6, 0.01)
    p = HybridProblem(
        layer_times=tuple(rng.uniform(0.01, 1.0) for _ in range(25)),
        output_bytes=tuple(rng.randint(1000, 10**6) for _ in range(25)),
        devices=(central, fast, fast, fast, slow, slow, slow, slow),
        param_bytes=tuple(rng.randint(10**4, 10**6) for _ in range(25)),
    )
    plan = solve_hybrid(p)
    check_valid(p, plan)
    assert plan.time < sum(p.layer_times) / 3


def test_min_share_keeps_every_member_above_it_and_still_equals_brute_force() -> None:
    """Batch normalisation over a handful of rows is noise: no member of a replicated stage gets less
    than ``min_share`` of the rows (a slow device is left out of a fast group rather than given 3 rows)."""
    rng = random.Random(7)
    constrained = 0
    for case in range(150):
        p = replace(random_problem(rng, ties=case % 2 == 0), min_share=rng.choice([0.2, 0.3, 0.45]))
        try:
            expected = brute_force_hybrid(p)
        except ValueError:
            with pytest.raises(ValueError):
                solve_hybrid(p)
            continue
        got = solve_hybrid(p)
        assert got == expected, (case, p)
        for shares in got.shares:
            assert len(shares) == 1 or min(shares) >= p.min_share
        free = solve_hybrid(replace(p, min_share=0.0))
        constrained += any(len(s) > 1 and min(s) < p.min_share for s in free.shares)
    assert constrained >= 5, constrained
    fast, slow = Device(1.0), Device(4.0)
    p = HybridProblem((0.1, 1.0), (100, 100), (Device(1.0), fast, fast, slow), param_bytes=(0, 0))
    assert solve_hybrid(p).groups == ((0,), (1, 2, 3))  # 0.44, 0.44, 0.11 of the rows
    assert solve_hybrid(replace(p, min_share=0.25)).groups == ((0,), (1, 2))
    with pytest.raises(ValueError, match="min_share"):
        replace(p, min_share=1.5)


# --------------------------------------------------------------------------------------------------
# Stage 0 replicated (replicate_first): the central node plus helpers fed with input rows


def test_replicate_first_equals_brute_force_on_random_instances() -> None:
    rng = random.Random(54)
    first = 0
    for case in range(200):
        p = random_problem(rng, ties=case % 2 == 0, max_devices=4, max_layers=5)
        p = replace(p, replicate_first=True, input_bytes=rng.choice([0, 500, 5000]))
        try:
            expected = brute_force_hybrid(p)
        except ValueError:
            with pytest.raises(ValueError, match="fits the memory limits"):
                solve_hybrid(p)
            continue
        got = solve_hybrid(p)
        assert got == expected, (case, p)
        assert got.groups[0][0] == 0 and fits_hybrid(p, got.points, got.groups)
        assert got.time == predict_hybrid(p, got.points, got.groups)
        assert got.time >= capacity_bound(p) * (1 - 1e-9)
        # Never worse than stage 0 alone: that plan is one of those it chooses among.
        assert got.time <= solve_hybrid(replace(p, replicate_first=False)).time * (1 + 1e-9)
        first += len(got.groups[0]) > 1
    assert first >= 20, first


def heavy_first_layer(bandwidth: float) -> HybridProblem:
    """The central node and three workers as fast as it; the first layer holds most of the compute."""
    return HybridProblem(
        layer_times=(4.0, 1.0),
        output_bytes=(1_000, 10),
        devices=(Device(1.0),) + (Device(1.0, bandwidth=bandwidth),) * 3,
        param_bytes=(1_000, 1_000),
        replicate_first=True,
        input_bytes=100_000,
    )


def test_stage_zero_gets_helpers_when_it_pays() -> None:
    p = heavy_first_layer(bandwidth=1e9)
    plan = solve_hybrid(p)
    # Every device in stage 0 (5 / 4 s) would be best, but a replicated stage 0 is never the only stage
    # (the runtime's central node would be the last stage): the central node and two helpers before a
    # worker (4 / 3 s).
    assert plan.groups == ((0, 1, 2), (3,)) and plan.points == (0, 1, 2)
    assert plan.shares[0] == pytest.approx((1 / 3,) * 3)
    assert plan.time == pytest.approx(4.0 / 3, rel=1e-3)  # alone, stage 0 takes 4.0
    assert capacity_bound(p) == 5.0 / 4  # every device busy all the time: no plan does better
    capped = solve_hybrid(replace(p, max_replicas=2))
    assert len(capped.groups[0]) == 2 and capped.time == pytest.approx(2.0, rel=1e-3)
    assert capped == brute_force_hybrid(replace(p, max_replicas=2))
    with pytest.raises(ValueError, match="the only stage"):
        predict_hybrid(p, (0, 2), ((0, 1, 2, 3),))
    assert solve_hybrid(replace(p, replicate_first=False)).time == 4.0
    assert plan == brute_force_hybrid(p)


def test_stage_zero_stays_alone_when_the_input_rows_cost_more() -> None:
    # 100 kB of input rows at 5 kB/s: a helper's fourth of them takes 5 s, more than the 4 s of stage 0
    # alone; the plan is the central node's alone, as without replicate_first.
    p = heavy_first_layer(bandwidth=5e3)
    plan = solve_hybrid(p)
    assert plan.groups[0] == (0,)
    assert plan == solve_hybrid(replace(p, replicate_first=False))
    assert plan == brute_force_hybrid(p)


def test_stage_zero_groups_are_validated() -> None:
    p = heavy_first_layer(bandwidth=1e9)
    with pytest.raises(ValueError, match="central node"):
        predict_hybrid(replace(p, replicate_first=False), (0, 1, 2), ((0, 1), (2,)))
    with pytest.raises(ValueError, match="central node"):
        predict_hybrid(p, (0, 1, 2), ((1,), (2,)))
    assert predict_hybrid(p, (0, 1, 2), ((0, 1), (2,))) == pytest.approx(2.0 + 2 * 1_000 / 1e9, rel=1e-3)
    with pytest.raises(ValueError, match="input_bytes"):
        replace(p, input_bytes=-1)
