"""Recovery policy: rollback version, sources, worker lists, the ResPipe baseline. No broker."""

from __future__ import annotations

import pytest
import torch

from edgeagent.errors import TrainingError
from edgeagent.models import ModelSpec, num_layers
from edgeagent.pipeline.build import make_stage
from edgeagent.pipeline.stage import Stage
from edgeagent.planner.recovery import choose_recovery_point, holders_of, new_worker_list, respipe_points
from edgeagent.protocol.messages import Repartition
from edgeagent.protocol.options import TrainOptions
from edgeagent.replication.store import WeightStore, replica_message, seeded
from edgeagent.replication.switch import Switch, serve_fetch

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


# -- the weight store and a recovery switch (in-process, no broker) ---------------------------------


SPEC = ModelSpec("cnn", (1, 8, 8), 10)


def stage_of(start: int, end: int, index: int, n: int, version: int = 0) -> Stage:
    return make_stage(
        SPEC,
        seed=0,
        start=start,
        end=end,
        index=index,
        num_stages=n,
        options=TrainOptions(learning_rate=0.1, momentum=0.9),
        version=version,
    )


def test_replica_with_a_bad_checksum_is_refused() -> None:
    stage = stage_of(2, 4, 1, 3, version=50)
    msg = replica_message("r", "a", 1, WeightStore("a").snapshot(stage), "chain", 0)
    store = WeightStore("b")
    store.add_replica(msg)
    assert store.holdings() == {"a": [50]}
    broken = msg.__class__(**{**msg.__dict__, "tensors": {k: v + 1 for k, v in msg.tensors.items()}})
    with pytest.raises(TrainingError, match="checksum"):
        store.add_replica(broken)


def test_store_keeps_the_latest_versions_and_drops_an_abandoned_timeline() -> None:
    store = WeightStore("a", keep=3)
    for version in (50, 100, 150, 200):
        store.snapshot(stage_of(2, 4, 1, 3, version=version))
    assert store.holdings() == {"a": [100, 150, 200]}
    store.drop_after(150)
    assert store.holdings() == {"a": [100, 150]}


def test_version_zero_is_the_seeded_model_anywhere() -> None:
    fresh = stage_of(2, 4, 1, 3)
    weights, momentum = WeightStore("x").get("a", 0, [2, 3], live=None, spec=SPEC, seed=0)
    assert momentum == {}
    for key, value in fresh.state().items():
        torch.testing.assert_close(weights[key], value)
    assert set(seeded(SPEC, 0, [3])) == set()  # layer 3 is a max-pool: nothing to carry


def test_recovery_switch_takes_the_dead_stage_from_its_chain_replica() -> None:
    total = num_layers(SPEC)
    dead = stage_of(2, 4, 1, 3, version=50)  # "a", about to die; its replica of version 50 is on "b"
    b_stage = stage_of(4, total, 2, 3, version=57)  # "b" went on training after the snapshot
    b_store = WeightStore("b")
    b_store.add_replica(replica_message("r", "a", 1, WeightStore("a").snapshot(dead), "chain", 0))
    b_store.snapshot(stage_of(4, total, 2, 3, version=50))  # its own snapshot at the replication point
    order = Repartition(
        run_id="r",
        plan_id=3,
        points=[0, 2, total],
        worker_list=["c", "b"],
        previous_points=[0, 2, 4, total],
        previous_workers=["c", "a", "b"],
        version=50,
        recovery=True,
        sources=["c", "b", "b"],
    )
    switch = Switch.start("b", order, b_store, b_stage, SPEC, 0)
    assert switch is not None and switch.complete  # everything from its own store: nothing to fetch
    options = TrainOptions(learning_rate=0.1, momentum=0.9)
    built = switch.build(SPEC, 0, options)
    assert (built.module.start, built.module.end, built.version) == (2, total, 50)
    torch.testing.assert_close(built.state()["layers.2.0.weight"], dead.state()["layers.2.0.weight"])


def test_a_holder_serves_a_replica_it_holds() -> None:
    dead = stage_of(2, 4, 1, 3, version=50)
    holder = WeightStore("b")
    holder.add_replica(replica_message("r", "a", 1, WeightStore("a").snapshot(dead), "chain", 0))
    order = Repartition(
        run_id="r",
        plan_id=3,
        points=[0, 3, num_layers(SPEC)],
        worker_list=["c", "b"],
        previous_points=[0, 2, 4, num_layers(SPEC)],
        previous_workers=["c", "a", "b"],
        version=50,
        recovery=True,
        sources=["c", "b", "b"],
    )
    c_store = WeightStore("c")
    c_store.snapshot(stage_of(0, 2, 0, 3, version=50))
    switch = Switch.start("c", order, c_store, stage_of(0, 2, 0, 3, version=52), SPEC, 0)
    assert switch is not None and switch.pending == {("b", "a"): {2}}
    (request,) = switch.requests()
    assert (request.version, request.of_device) == (50, "a")
    assert switch.accept(serve_fetch(holder, None, request, SPEC, 0, "r"))
    assert switch.complete


def test_a_resumed_run_never_rolls_back_past_its_start_to_the_seeded_model() -> None:
    # Resumed at version 300: every stage replicated it when the run started (Worker._assign), and a
    # stage died before the first chain replication. The seeded model (version 0) is not this run's.
    holdings = {"c": {"c": [300], "a": [300], "b": [300]}, "b": {"b": [300], "a": [300]}}
    point = choose_recovery_point(OLD, {"c", "b"}, holdings, seeded=False, start=300)
    assert point.version == 300 and point.sources == ("c", "b", "b")
    # The old rule offered version 0 whenever nothing newer was complete: a silent reset.
    lost = {"c": {"c": [300]}, "b": {"b": [300]}}
    with pytest.raises(TrainingError, match="from 300 on"):
        choose_recovery_point(OLD, {"c", "b"}, lost, seeded=False, start=300)
    assert choose_recovery_point(OLD, {"c", "b"}, lost).version == 0  # a fresh seeded run may restart


def test_a_held_snapshot_of_version_zero_wins_over_the_seeded_rebuild() -> None:
    stage = stage_of(0, num_layers(SPEC), 0, 1)
    with torch.no_grad():
        for p in stage.module.parameters():
            p.fill_(0.5)  # pre-trained weights (--init-weights), not the seeded ones
    store = WeightStore("c")
    store.snapshot(stage)
    layers = list(range(num_layers(SPEC)))
    weights, _ = store.get("c", 0, layers, live=None, spec=SPEC, seed=0)
    assert weights and all(torch.all(t == 0.5) for t in weights.values())
    reseeded, _ = WeightStore("x").get("c", 0, layers, live=None, spec=SPEC, seed=0)
    assert any(not torch.all(t == 0.5) for t in reseeded.values())
