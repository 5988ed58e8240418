"""The balanced partition (``planner/partition.py``) against brute force; cut-point checks."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeagent.planner.partition import balanced_partition, check_points, stage_of_layer


def _stage_costs(costs: Sequence[float], points: list[int]) -> list[float]:
    return [sum(costs[a:b]) for a, b in itertools.pairwise(points)]


def _brute_force(costs: Sequence[float], k: int) -> float:
    n = len(costs)
    return min(max(_stage_costs(costs, [0, *cuts, n])) for cuts in itertools.combinations(range(1, n), k - 1))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=9).flatmap(
        lambda costs: st.tuples(st.just(costs), st.integers(min_value=1, max_value=len(costs)))
    )
)
def test_balanced_partition_matches_brute_force(case: tuple[list[int], int]) -> None:
    costs, k = case
    points = balanced_partition([float(c) for c in costs], k)
    check_points(points, len(costs))
    assert len(points) == k + 1
    # Integer costs: exact comparison.
    assert max(_stage_costs(costs, points)) == _brute_force(costs, k)


def test_balanced_partition_matches_brute_force_float_costs() -> None:
    rng = random.Random(11)
    for _ in range(200):
        n = rng.randint(1, 8)
        costs = [rng.uniform(0.0, 5.0) for _ in range(n)]
        k = rng.randint(1, n)
        points = balanced_partition(costs, k)
        check_points(points, n)
        assert max(_stage_costs(costs, points)) == pytest.approx(_brute_force(costs, k), rel=1e-9)


@pytest.mark.parametrize("k", [0, 4, -1])
def test_balanced_partition_rejects_bad_stage_count(k: int) -> None:
    with pytest.raises(ValueError):
        balanced_partition([1.0, 2.0, 3.0], k)


@pytest.mark.parametrize(
    ("points", "n"),
    [
        ([], 3),
        ([0], 0),
        ([3], 3),
        ([1, 3], 3),
        ([0, 2], 3),
        ([0, 4], 3),
        ([0, 2, 2, 3], 3),
        ([0, 3, 2, 3], 3),
        ([0, 0, 3], 3),
        ([0, 1, 3, 3], 3),
    ],
)
def test_check_points_rejects_bad_points(points: list[int], n: int) -> None:
    with pytest.raises(ValueError):
        check_points(points, n)


@pytest.mark.parametrize(("points", "n"), [([0, 3], 3), ([0, 1, 2, 3], 3), ([0, 2, 5], 5)])
def test_check_points_accepts_good_points(points: list[int], n: int) -> None:
    check_points(points, n)
    assert [stage_of_layer(points, layer) for layer in range(n)] == [
        i for i, (a, b) in enumerate(itertools.pairwise(points)) for _ in range(a, b)
    ]
    with pytest.raises(ValueError):
        stage_of_layer(points, n)
