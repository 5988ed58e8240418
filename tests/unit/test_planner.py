"""Planner policy: capacities (eq. 1-3), the partition DP (eq. 4-7) and weight redistribution (Alg. 1)."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import pytest

from edgeagent.planner.capacity import capacities, capacity, scaled_layer_times
from edgeagent.planner.dp import (
    Link,
    Problem,
    brute_force,
    comm_time,
    compute_time,
    fits,
    moved_bytes,
    predict,
    problem_for_uniform,
    repartition_gain,
    solve,
    stage_memory,
)
from edgeagent.planner.partition import balanced_partition, check_points, stage_of_layer
from edgeagent.planner.redistribute import (
    DevicePlan,
    algorithm1,
    recovery_sources,
    redistribution_plan,
)

FREE = Link(math.inf)


def random_points(rng: random.Random, num_layers: int, num_stages: int) -> list[int]:
    return [0, *sorted(rng.sample(range(1, num_layers), num_stages - 1)), num_layers]


def all_splits(num_layers: int, num_stages: int) -> list[list[int]]:
    return [[0, *c, num_layers] for c in itertools.combinations(range(1, num_layers), num_stages - 1)]


# --------------------------------------------------------------------------------------------------
# Capacity (eq. 1-3)


def test_capacities_recover_known_slowdowns() -> None:
    rng = random.Random(1)
    for _ in range(50):
        num_layers = rng.randint(1, 12)
        n = rng.randint(1, num_layers)
        times = [rng.uniform(0.001, 2.0) for _ in range(num_layers)]
        points = random_points(rng, num_layers, n)
        true = [rng.uniform(0.1, 20.0) for _ in range(n)]
        stage_times = [c * sum(times[points[i] : points[i + 1]]) for i, c in enumerate(true)]
        assert capacities(stage_times, times, points) == pytest.approx(true, rel=1e-12)


def test_capacity_and_scaling() -> None:
    times = [1.0, 2.0, 3.0]
    assert capacity(10.0, times, 1, 3) == 2.0
    assert scaled_layer_times(times, 2.5) == [2.5, 5.0, 7.5]
    with pytest.raises(ValueError, match=r"\[2, 2\)"):
        capacity(1.0, times, 2, 2)
    with pytest.raises(ValueError, match=r"is 0\.0"):
        capacity(1.0, [0.0, 1.0], 0, 1)
    with pytest.raises(ValueError, match="2 stage times for 3 stages"):
        capacities([1.0, 1.0], times, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="-1"):
        scaled_layer_times(times, -1.0)


# --------------------------------------------------------------------------------------------------
# The DP (eq. 4-7)


def random_problem(rng: random.Random, *, ties: bool) -> Problem:
    """Small random instances; ``ties`` draws from small integer sets so that optima are often shared."""
    num_layers = rng.randint(1, 8)
    n = rng.randint(1, min(4, num_layers))
    if ties:
        times = tuple(float(rng.randint(1, 3)) for _ in range(num_layers))
        sizes = tuple(rng.choice([0, 1000, 2000, 4000]) for _ in range(num_layers))
        caps = tuple(rng.choice([0.5, 1.0, 2.0]) for _ in range(n))
        bandwidths = rng.sample([500.0, 1000.0, 2000.0, 4000.0, 8000.0], n - 1)
        latencies = [rng.choice([0.0, 0.5]) for _ in range(n - 1)]
    else:
        times = tuple(rng.uniform(0.01, 5.0) for _ in range(num_layers))
        sizes = tuple(rng.randint(0, 10**6) for _ in range(num_layers))
        caps = tuple(rng.uniform(0.2, 10.0) for _ in range(n))
        bandwidths = [10 ** rng.uniform(4, 7) for _ in range(n - 1)]  # distinct per link
        latencies = [rng.choice([0.0, rng.uniform(0.0, 0.5)]) for _ in range(n - 1)]
    links = tuple(Link(b, lat) for b, lat in zip(bandwidths, latencies, strict=True))
    params: tuple[int, ...] | None = None
    limits: tuple[float | None, ...] | None = None
    if rng.random() < 0.5:
        params = tuple(rng.randint(1, 10_000) for _ in range(num_layers))
        total = (sum(params) * (n + 3) + n * sum(sizes)) / n
        limits = tuple(rng.choice([None, total * rng.uniform(0.3, 3.0)]) for _ in range(n))
    return Problem(
        layer_times=times,
        output_bytes=sizes,
        capacities=caps,
        links=links,
        param_bytes=params,
        memory_limits=limits,
        in_flight=rng.randint(0, n + 1),
        activation_factor=rng.choice([1.0, 0.25]),
    )


def test_dp_equals_brute_force_on_random_instances() -> None:
    rng = random.Random(2024)
    infeasible = shared_optimum = 0
    for case in range(400):
        p = random_problem(rng, ties=case % 2 == 0)
        try:
            expected = brute_force(p)
        except ValueError:
            infeasible += 1
            with pytest.raises(ValueError, match="fits the memory limits"):
                solve(p)
            continue
        got = solve(p)
        check_points(got, p.num_layers)
        assert fits(p, got)
        assert predict(p, got) == predict(p, expected), (case, p)
        # Same tie rule in both, so the points agree even when several splits are optimal.
        assert got == expected, (case, p)
        best = predict(p, got)
        shared_optimum += (
            sum(1 for s in all_splits(p.num_layers, p.num_stages) if fits(p, s) and predict(p, s) == best) > 1
        )
    assert infeasible >= 10 and shared_optimum >= 30, (infeasible, shared_optimum)


def test_each_link_uses_its_own_bandwidth() -> None:
    # Link 0 is slow and only layer 0's output is small, so the first cut must follow layer 0. A DP that
    # gave every link the last (fast) link's bandwidth would choose the balanced [0, 2, 4, 6] instead.
    p = Problem(
        layer_times=(1.0,) * 6,
        output_bytes=(1, 100, 100, 100, 100, 100),
        capacities=(1.0, 1.0, 1.0),
        links=(Link(1.0), Link(1e9)),
    )
    assert comm_time(p, 0, 1) == 200.0
    assert comm_time(p, 1, 1) == pytest.approx(2e-7)
    points = solve(p)
    assert points[1] == 1
    assert predict(p, points) == 3.0
    assert points == brute_force(p)
    aliased = replace(p, links=(p.links[-1],) * 2)
    assert solve(aliased) == [0, 2, 4, 6]
    assert predict(p, [0, 2, 4, 6]) == 200.0


def test_slow_middle_link_of_four() -> None:
    # Only link 1 is slow; only layer 4 has a small output, so stage 1 must end with layer 4.
    sizes = [100] * 8
    sizes[4] = 1
    p = Problem(
        layer_times=(1.0,) * 8,
        output_bytes=tuple(sizes),
        capacities=(1.0,) * 4,
        links=(Link(1e9), Link(1.0), Link(2e9)),
    )
    points = solve(p)
    assert points[2] == 5
    assert points == brute_force(p)
    assert solve(replace(p, links=(p.links[-1],) * 3))[2] != 5
    assert solve(replace(p, links=(p.links[0],) * 3))[2] != 5


def test_latency_and_activation_factor_enter_comm_time() -> None:
    p = Problem(
        layer_times=(1.0, 1.0),
        output_bytes=(1000, 10),
        capacities=(1.0, 2.0),
        links=(Link(100.0, latency=0.5),),
        activation_factor=0.5,
    )
    assert comm_time(p, 0, 0) == 2 * (0.5 + 1000 * 0.5 / 100.0)
    assert compute_time(p, 1, 1, 2) == 2.0
    assert predict(p, [0, 1, 2]) == 11.0


def test_slow_device_gets_fewer_layers() -> None:
    p = problem_for_uniform([1.0] * 30, [0] * 30, 3)
    p = replace(p, capacities=(1.0, 10.0, 1.0))
    points = solve(p)
    sizes = [b - a for a, b in itertools.pairwise(points)]
    assert sizes[1] < min(sizes[0], sizes[2])
    assert points == [0, 15, 16, 30]
    assert predict(p, points) == 15.0


def test_equal_devices_and_free_links_match_balanced_partition() -> None:
    rng = random.Random(7)
    for _ in range(100):
        num_layers = rng.randint(1, 12)
        n = rng.randint(1, num_layers)
        costs = [rng.uniform(0.01, 3.0) for _ in range(num_layers)]
        p = problem_for_uniform(costs, [rng.randint(0, 10**6) for _ in costs], n)
        balanced = balanced_partition(costs, n)
        balanced_max = max(sum(costs[a:b]) for a, b in itertools.pairwise(balanced))
        assert predict(p, solve(p)) == pytest.approx(balanced_max, rel=1e-12)


def test_memory_limit_moves_layers_off_a_poor_device() -> None:
    base = Problem(
        layer_times=(1.0,) * 4,
        output_bytes=(0,) * 4,
        capacities=(1.0, 1.0),
        links=(FREE,),
        param_bytes=(100,) * 4,
    )
    assert solve(base) == [0, 2, 4]
    # Two batches in flight on stage 0, one on stage 1: (f + 1 stashed/live + 2) copies of the params.
    assert stage_memory(base, 0, 0, 1) == 100 * (2 + 1 + 2)
    assert stage_memory(base, 1, 3, 4) == 100 * (1 + 1 + 2)
    poor = replace(base, memory_limits=(None, 450.0))
    assert solve(poor) == [0, 3, 4]
    assert brute_force(poor) == [0, 3, 4]
    with pytest.raises(ValueError, match=r"450\.0.*total parameter bytes 400"):
        solve(replace(base, memory_limits=(500.0, 450.0)))


def test_stage_memory_counts_activations_per_batch_in_flight() -> None:
    p = Problem(
        layer_times=(1.0,) * 3,
        output_bytes=(10, 20, 30),
        capacities=(1.0,) * 3,
        links=(FREE, FREE),
        param_bytes=(1, 2, 3),
        in_flight=4,
    )
    assert stage_memory(p, 0, 0, 1) == 1 * (4 + 3) + 4 * 10
    assert stage_memory(p, 2, 1, 3) == 5 * (2 + 3) + 2 * 50
    assert stage_memory(replace(p, in_flight=1), 2, 1, 3) == 5 * (1 + 3) + 1 * 50


def test_problem_validation() -> None:
    ok = Problem(layer_times=(1.0, 1.0), output_bytes=(1, 1), capacities=(1.0, 1.0), links=(FREE,))
    assert (ok.num_stages, ok.num_layers, ok.bound) == (2, 2, 2)
    with pytest.raises(ValueError, match="0 links for 2 stages"):
        replace(ok, links=())
    with pytest.raises(ValueError, match="2 layers into 3 stages"):
        replace(ok, capacities=(1.0, 1.0, 1.0), links=(FREE, FREE))
    with pytest.raises(ValueError, match="bandwidth 0"):
        Link(0.0)
    with pytest.raises(ValueError, match=r"capacities\[1\] = -1"):
        replace(ok, capacities=(1.0, -1.0))
    with pytest.raises(ValueError, match="1 memory limits for 2 stages"):
        replace(ok, memory_limits=(1.0,))
    with pytest.raises(ValueError, match="give 1 stages, need 2"):
        predict(ok, [0, 2])


def test_moved_bytes() -> None:
    assert moved_bytes([0, 2, 4], [0, 2, 4], [5, 6, 7, 8]) == 0
    assert moved_bytes([0, 2, 4], [0, 1, 4], [5, 6, 7, 8]) == 6
    assert moved_bytes([0, 2, 4], [0, 3, 4], [5, 6, 7, 8]) == 7


def test_repartition_gain() -> None:
    p = Problem(
        layer_times=(1.0,) * 4,
        output_bytes=(0,) * 4,
        capacities=(1.0, 1.0),
        links=(FREE,),
        param_bytes=(1000,) * 4,
    )
    assert repartition_gain(p, [0, 1, 4], [0, 1, 4], horizon_batches=100, move_bandwidth=1e6) == (
        False,
        0.0,
        0.0,
    )
    worth, gain, cost = repartition_gain(p, [0, 1, 4], [0, 2, 4], horizon_batches=100, move_bandwidth=1e6)
    assert worth and gain == 100.0 and cost == pytest.approx(2000 / 1e6)
    worth, gain, cost = repartition_gain(
        p, [0, 1, 4], [0, 2, 4], horizon_batches=1, move_bandwidth=10.0, overhead=1.0
    )
    assert not worth and gain == 1.0 and cost == pytest.approx(2000 / 10.0 + 1.0)
    with pytest.raises(ValueError, match="4 layers"):
        repartition_gain(
            replace(p, param_bytes=None), [0, 1, 4], [0, 2, 4], horizon_batches=1, move_bandwidth=1
        )


# --------------------------------------------------------------------------------------------------
# Algorithm 1 and the device plan


P_CUR = [0, 2, 4, 6, 8]  # n = 4 stages before the failure: central node 0, workers 1..3


def test_algorithm1_failure_in_the_middle() -> None:
    p_new = [0, 3, 6, 8]  # stage 2 failed; old 3 is now 2 and holds stage 2's chain replica
    assert algorithm1(p_new, P_CUR, 2, 0, 0, 4) == ({1: [2]}, [0, 1])
    assert algorithm1(p_new, P_CUR, 2, 1, 1, 4) == ({2: [4, 5]}, [3])
    assert algorithm1(p_new, P_CUR, 2, 3, 2, 4) == ({}, [6, 7])
    # Old stage 3's own layer and stage 2's replica both live on new index 2.
    assert algorithm1([0, 2, 7, 8], P_CUR, 2, 1, 1, 4) == ({2: [4, 5, 6]}, [2, 3])
    # The replica holder itself needs the failed layers: the listing names its own (new) index.
    assert algorithm1([0, 2, 4, 8], P_CUR, 2, 3, 2, 4) == ({2: [4, 5]}, [6, 7])
    with pytest.raises(ValueError, match="stage 2 failed"):
        algorithm1(p_new, P_CUR, 2, 2, 1, 4)
    with pytest.raises(ValueError, match="new index 3 for current index 3"):
        algorithm1(p_new, P_CUR, 2, 3, 3, 4)
    with pytest.raises(ValueError, match=r"failed index 0 is outside 1\.\.3"):
        algorithm1(p_new, P_CUR, 0, 1, 0, 4)
    with pytest.raises(ValueError, match="give 4 stages; expected 3"):
        algorithm1(P_CUR, P_CUR, 2, 1, 1, 4)


def test_algorithm1_last_stage_fails_target_is_central_node() -> None:
    p_new = [0, 3, 5, 8]
    assert algorithm1(p_new, P_CUR, 3, 2, 2, 4) == ({0: [6, 7]}, [5])
    assert algorithm1(p_new, P_CUR, 3, 1, 1, 4) == ({2: [4]}, [3])
    assert algorithm1(p_new, P_CUR, 3, 0, 0, 4) == ({1: [2]}, [0, 1])
    # Three stages, the last fails, the central node takes layer 4 from its own replica.
    assert algorithm1([0, 5, 6], [0, 2, 4, 6], 2, 0, 0, 3) == ({1: [2, 3], 0: [4]}, [0, 1])


def test_algorithm1_dynamic_repartition_has_no_correction() -> None:
    p_new = [0, 1, 5, 7, 8]
    assert algorithm1(p_new, P_CUR, None, 0, 0, 4) == ({}, [0])
    assert algorithm1(p_new, P_CUR, None, 1, 1, 4) == ({0: [1], 2: [4]}, [2, 3])
    assert algorithm1(p_new, P_CUR, None, 2, 2, 4) == ({3: [6]}, [5])
    assert algorithm1(p_new, P_CUR, None, 3, 3, 4) == ({}, [7])
    with pytest.raises(ValueError, match="new index 2 for current index 3"):
        algorithm1(p_new, P_CUR, None, 3, 2, 4)


def test_recovery_sources() -> None:
    workers = ["c", "a", "b", "d"]
    assert recovery_sources(workers, set()) == workers
    assert recovery_sources(workers, {"a"}) == ["c", "b", "b", "d"]
    assert recovery_sources(workers, {"d"}) == ["c", "a", "b", "c"]
    assert recovery_sources(workers, {"a", "b"}) == ["c", "c", "d", "d"]
    with pytest.raises(ValueError, match="central node 'c'"):
        recovery_sources(workers, {"c"})
    with pytest.raises(ValueError, match=r"\['x'\]"):
        recovery_sources(workers, {"x"})


def test_algorithm1_agrees_with_the_device_plan() -> None:
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(2, 5)
        num_layers = rng.randint(n, 10)
        p_cur = random_points(rng, num_layers, n)
        i_fail = rng.choice([None, rng.randint(1, n - 1)])
        p_new = random_points(rng, num_layers, n if i_fail is None else n - 1)
        old_workers = ["central", *(f"w{i}" for i in range(1, n))]
        failed = set() if i_fail is None else {old_workers[i_fail]}
        new_workers = [w for w in old_workers if w not in failed]
        plan = redistribution_plan(p_cur, p_new, recovery_sources(old_workers, failed), new_workers)
        for i_cur, device in enumerate(old_workers):
            if device in failed:
                continue
            i_new = i_cur - 1 if i_fail is not None and i_cur > i_fail else i_cur
            m_need, local = algorithm1(p_new, p_cur, i_fail, i_cur, i_new, n)
            assert plan[device].stage == i_new
            assert plan[device].local == tuple(sorted(local + m_need.get(i_new, [])))
            assert plan[device].fetch == {new_workers[t]: tuple(v) for t, v in m_need.items() if t != i_new}


def check_plan(
    plans: dict[str, DevicePlan],
    old_points: list[int],
    new_points: list[int],
    old_workers: list[str],
    new_workers: list[str],
) -> None:
    assert list(plans) == new_workers
    for stage, device in enumerate(new_workers):
        plan = plans[device]
        assert (plan.device, plan.stage, plan.start, plan.end) == (
            device,
            stage,
            new_points[stage],
            new_points[stage + 1],
        )
        assert device not in plan.fetch
        covered = list(plan.local) + [layer for layers in plan.fetch.values() for layer in layers]
        assert sorted(covered) == list(range(plan.start, plan.end))  # exactly, no layer twice
        for layer in plan.local:
            assert old_workers[stage_of_layer(old_points, layer)] == device
        for source, layers in plan.fetch.items():
            assert layers and list(layers) == sorted(layers)
            for layer in layers:
                assert old_workers[stage_of_layer(old_points, layer)] == source


def test_redistribution_plan_for_every_shift() -> None:
    num_layers = 6
    workers = ["c", "a", "b", "d"]
    splits = all_splits(num_layers, 3) + all_splits(num_layers, 4)
    rng = random.Random(3)
    for old, new in itertools.product(splits, splits):
        old_workers = workers[: len(old) - 1]
        if len(old) == len(new):
            # Dynamic re-partition on the same devices, and the same on a reordered list.
            check_plan(
                redistribution_plan(old, new, old_workers, old_workers), old, new, old_workers, old_workers
            )
            shuffled = [old_workers[0], *rng.sample(old_workers[1:], len(old_workers) - 1)]
            plans = redistribution_plan(old, new, old_workers, shuffled)
            check_plan(plans, old, new, old_workers, shuffled)
        elif len(new) < len(old):
            # One device failed: its layers come from its replica holder.
            failed = rng.choice(old_workers[1:])
            new_workers = [w for w in old_workers if w != failed]
            sources = recovery_sources(old_workers, {failed})
            plans = redistribution_plan(old, new, sources, new_workers)
            check_plan(plans, old, new, sources, new_workers)
            assert all(failed not in plan.fetch for plan in plans.values())
        else:
            # A device joins: it holds nothing and fetches its whole range.
            new_workers = [*old_workers, "joiner"]
            plans = redistribution_plan(old, new, old_workers, new_workers)
            check_plan(plans, old, new, old_workers, new_workers)
            assert plans["joiner"].local == ()


def test_redistribution_plan_rejects_a_dead_source() -> None:
    old_workers, new_workers = ["c", "a", "b", "d"], ["c", "a", "d"]
    with pytest.raises(ValueError, match=r"layer 4 \(old stage 2\) would come from 'b'"):
        redistribution_plan(P_CUR, [0, 3, 6, 8], old_workers, new_workers)
    # A device that leaves on purpose can still serve its layers.
    plans = redistribution_plan(P_CUR, [0, 3, 6, 8], old_workers, new_workers, alive=old_workers)
    assert plans["a"].fetch == {"b": (4, 5)}
    with pytest.raises(ValueError, match="3 old workers for 4 old stages"):
        redistribution_plan(P_CUR, [0, 3, 6, 8], ["c", "a", "b"], new_workers)
    with pytest.raises(ValueError, match="repeats a device"):
        redistribution_plan(P_CUR, [0, 3, 6, 8], old_workers, ["c", "a", "a"])
