"""Recovery policy: rollback version, sources, worker lists, the ResPipe baseline. No broker."""

from __future__ import annotations

import pytest

from edgeagent.planner.recovery import choose_recovery_point, holders_of, new_worker_list, respipe_points

OLD = ["c", "a", "b"]


def test_worker_list_keeps_order_and_drops_failed() -> None:
    assert new_worker_list(["c", "a", "b", "d"], {"c", "b", "d"}) == ["c", "b", "d"]
    assert new_worker_list(["c", "a", "b", "d"], {"c", "d"}) == ["c", "d"]


def test_chain_holders_wrap_to_the_central_node() -> None:
    assert holders_of(OLD, 1, 1) == ["b"]
    assert holders_of(OLD, 2, 1) == ["c"]  # the last stage replicates to the central node
    assert holders_of(["c", "a", "b", "d"], 1, 2) == ["b", "d"]  # ResPipe: z nearest neighbours


def test_one_failure_uses_the_chain_replica_at_the_newest_common_version() -> None:
    holdings = {"c": {"c": [50, 100], "b": [100]}, "b": {"b": [50, 100], "a": [50, 100]}}
    point = choose_recovery_point(OLD, {"c", "b"}, holdings)
    assert point.version == 100
    assert point.sources == ("c", "b", "b")  # a's layers come from b, its chain successor


def test_missing_replica_falls_back_to_an_older_version() -> None:
    holdings = {"c": {"c": [50, 100]}, "b": {"b": [50, 100], "a": [50]}}  # a's replica 100 never completed
    assert choose_recovery_point(OLD, {"c", "b"}, holdings).version == 50


def test_two_failures_use_the_global_replica() -> None:
    holdings = {"c": {"c": [50, 100], "a": [100], "b": [50, 100]}}
    point = choose_recovery_point(OLD, {"c"}, holdings)
    assert point == point.__class__(100, ("c", "c", "c"))


def test_last_stage_failure_is_served_by_the_central_node() -> None:
    holdings = {"c": {"c": [50], "b": [50]}, "a": {"a": [50]}}
    assert choose_recovery_point(OLD, {"c", "a"}, holdings).sources == ("c", "a", "c")


def test_no_replica_at_all_restarts_from_the_seeded_model() -> None:
    point = choose_recovery_point(OLD, {"c", "b"}, {"c": {}, "b": {}})
    assert point.version == 0
    assert point.sources == ("c", "c", "b")


@pytest.mark.parametrize(
    ("points", "old", "dead", "expected"),
    [
        ([0, 3, 6, 9], ["c", "a", "b"], {"a"}, ([0, 3, 9], ["c", "b"])),  # next worker takes over
        ([0, 3, 6, 9], ["c", "a", "b"], {"b"}, ([0, 3, 9], ["c", "a"])),  # last: the previous one does
        ([0, 2, 4, 6, 8], ["c", "a", "b", "d"], {"a", "b"}, ([0, 2, 8], ["c", "d"])),
        ([0, 2, 4, 6, 8], ["c", "a", "b", "d"], {"a", "d"}, ([0, 2, 8], ["c", "b"])),
    ],
)
def test_respipe_next_worker_takes_over(
    points: list[int], old: list[str], dead: set[str], expected: tuple[list[int], list[str]]
) -> None:
    assert respipe_points(points, old, dead) == expected


def test_central_node_cannot_fail() -> None:
    with pytest.raises(ValueError, match="central"):
        respipe_points([0, 1, 2], ["c", "a"], {"c"})
