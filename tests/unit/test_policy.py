"""Pure policy taken out of the central node: when to re-split and which split, which recovery case,
which bit widths. No broker."""

from __future__ import annotations

import pytest

from edgeagent.compression.schedule import stage_bits
from edgeagent.errors import ConfigError
from edgeagent.planner.dp import Link, Problem
from edgeagent.planner.policy import RepartitionPolicy, choose_plan
from edgeagent.planner.recovery import classify_probe


def test_repartition_is_due_after_the_first_batches_then_every_interval() -> None:
    policy = RepartitionPolicy(first=10, every=100)
    assert [d for d in range(1, 400) if policy.due(d)] == [10, 110, 210, 310]


def _problem(caps: tuple[float, ...], bandwidth: float = 1e9) -> Problem:
    return Problem(
        layer_times=(1.0, 1.0, 1.0, 1.0),
        output_bytes=(1000, 1000, 1000, 1000),
        capacities=caps,
        links=tuple(Link(bandwidth) for _ in caps[1:]),
        param_bytes=(10_000_000,) * 4,
    )


def test_a_split_moves_only_when_the_gain_beats_the_cost_of_moving_the_weights() -> None:
    slow_last = _problem((1.0, 1.0, 4.0))
    moved = choose_plan(slow_last, [0, 1, 2, 4], horizon_batches=100, move_bandwidth=1e9)
    assert moved.points == [0, 2, 3, 4] and "gain" in moved.reason
    # The same gain, but 40 MB over a 1 kB/s link: not worth it within 100 batches.
    kept = choose_plan(slow_last, [0, 1, 2, 4], horizon_batches=100, move_bandwidth=1e3)
    assert kept.points == [0, 1, 2, 4] and kept.reason.startswith("kept")
    joined = choose_plan(slow_last, [0, 1, 2, 4], joiners=["pi-9"], horizon_batches=100, move_bandwidth=1e3)
    assert joined.points == [0, 2, 3, 4] and "joined" in joined.reason


def test_the_probe_decides_the_recovery_case() -> None:
    workers = ["a", "b", "c"]
    assert classify_probe(workers, {"a", "b", "c"}, []).case == 1
    restarted = classify_probe(workers, {"a", "c"}, ["b", "stranger"])
    assert (restarted.case, restarted.restarted, restarted.missing) == (2, frozenset({"b"}), frozenset())
    gone = classify_probe(workers, {"a"}, ["b"])
    assert (gone.case, gone.restarted, gone.missing) == (3, frozenset({"b"}), frozenset({"c"}))


def test_bit_widths_per_mode() -> None:
    assert stage_bits("none", 3, epoch=0, epochs=5) == ([32] * 3, [32] * 3)
    assert stage_bits("2", 3, epoch=0, epochs=5) == ([2] * 3, [8] * 3)
    assert stage_bits("adaptive", 2, epoch=4, epochs=5) == ([4, 4], [4, 4])
    assert stage_bits("3", 1, epoch=0, epochs=5) == ([32], [32])  # the central node alone: nothing sent
    # auto: a fast first link (nothing to compress), a slow second one (2-bit activations, 4-bit grads).
    links = [(1e12, 4_000_000), (1.0, 4_000_000)]
    bits = stage_bits("auto", 3, epoch=0, epochs=5, links=links, compute_seconds=0.1)
    assert bits == ([32, 2, 32], [32, 32, 4])
    with pytest.raises(ConfigError, match="expected none"):
        stage_bits("7", 3, epoch=0, epochs=5)
