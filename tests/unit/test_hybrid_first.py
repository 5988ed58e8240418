"""Stage 0 replicated (the hybrid mode's ``replicate_first``): the pure parts. The rows the central node
sends its helpers, the checks a helper makes of them, the input topic's identity and access rules, and the
members' sums every member (the central node too) applies."""

from __future__ import annotations

import torch

from edgeagent.modes.pipeline.central.hybrid_first import input_pieces
from edgeagent.modes.pipeline.worker.hybrid_intake import input_problem
from edgeagent.pipeline.groups import Groups, averaged_buffers, summed, whole_update
from edgeagent.protocol.acl import Grant, PlanTracker, may_publish, may_subscribe
from edgeagent.protocol.identity import PlanView, StageSenders, identity_problem
from edgeagent.protocol.messages import Activation, GradSync
from edgeagent.protocol.topics import Family, Topics

T = Topics("c1")
DEVICE = Grant("device", "c1")


def inputs(stage: int = -1, rows: list[int] | None = None, mode: str = "train") -> Activation:
    lo, hi = rows or [3, 8]
    return Activation(
        run_id="r",
        plan_id=0,
        stage=stage,
        batch_id=5,
        version=2,
        mode=mode,  # type: ignore[arg-type]
        x=torch.zeros(hi - lo, 3),
        y=torch.zeros(hi - lo, dtype=torch.long),
        rows=[lo, hi],
        total=8,
    )


def test_the_helpers_get_their_rows_and_the_central_node_keeps_its_own() -> None:
    groups = Groups((("central", "w1", "w2"), ("w3",)), ((0.25, 0.25, 0.5), (1.0,)))
    rows = [groups.rows(0, d, 32) for d in groups.members[0]]
    assert rows == [(0, 8), (8, 16), (16, 32)]
    assert input_pieces(rows, groups.members[0], "central") == [("w1", (8, 16)), ("w2", (16, 32))]
    # Fewer rows than members: a helper with none gets no message.
    few = [groups.rows(0, d, 2) for d in groups.members[0]]
    assert input_pieces(few, groups.members[0], "central") == [("w1", (1, 2))]
    # After a failover the central node is alone: nothing to send.
    alone, _ = groups.without(["w1", "w2"])
    assert input_pieces([alone.rows(0, "central", 32)], alone.members[0], "central") == []


def test_a_helper_takes_input_rows_only_from_the_central_node_as_the_datas() -> None:
    assert input_problem(inputs(), "central", "central") is None
    assert "only the central node" in str(input_problem(inputs(), "central", "w2"))
    assert "stage -1" in str(input_problem(inputs(stage=0), "central", "central"))
    assert "evaluation" in str(input_problem(inputs(mode="eval"), "central", "central"))
    whole = Activation(
        run_id="r", plan_id=0, stage=-1, batch_id=5, version=2, mode="train",
        x=torch.zeros(8, 3), y=torch.zeros(8, dtype=torch.long),
    )  # fmt: skip
    assert "without their rows" in str(input_problem(whole, "central", "central"))


def test_input_rows_travel_on_stage_zeros_input_topic_as_stage_minus_one() -> None:
    topic = T.inputs("central")
    assert topic == "edgeagent/v1/c1/stage/0/input/central"
    info = T.parse(topic)
    assert info.family is Family.INPUTS and info.stage == 0 and info.device == "central"
    assert identity_problem(info, "central", inputs()) is None
    assert "as stage 0's input rows (stage -1)" in str(identity_problem(info, "central", inputs(stage=0)))
    assert identity_problem(info, "w1", inputs()) is not None  # only the topic's device sends there
    # A helper of stage 0 reads them; a device that holds no stage 0 cannot send stage 0's inputs.
    plans = PlanTracker()
    plans.update("c1", "r", 0, ["central", "w3"], groups=[["central", "w1"], ["w3"]])
    assert may_subscribe("w1", DEVICE, T.stage_filter(Family.INPUTS, 0))
    assert not may_publish("w3", DEVICE, T.inputs("w3"), plans)
    senders = StageSenders()
    senders.plan = lambda: PlanView("r", 0, [["central", "w1"], ["w3"]])
    assert senders.problem(T.parse(T.inputs("w3")), inputs()) is not None
    assert senders.problem(info, inputs()) is None


def sync(device: str, rows: tuple[int, int], version: int, g: float, mean: float) -> GradSync:
    return GradSync(
        run_id="r",
        plan_id=0,
        stage=0,
        batch_id=5,
        share_version=version,
        device_id=device,
        rows=list(rows),
        total=8,
        grads={"w": torch.full((2,), g)},
        buffers={"bn.running_mean": torch.full((2,), mean)},
    )


def test_the_central_node_and_its_helpers_pick_the_same_whole_update() -> None:
    # Share version 0: the central node's rows and a helper's that died before sending its own.
    by_version = {0: {"central": sync("central", (0, 2), 0, 1.0, 0.0)}}
    assert whole_update(by_version) is None
    # The failover's version 1: the central node alone over every row.
    by_version[1] = {"central": sync("central", (0, 8), 1, 5.0, 4.0)}
    parts = whole_update(by_version)
    assert parts is not None and [p.share_version for p in parts] == [1]
    # Had the helper's rows come in, version 0 is whole and picked, in row order, whatever arrived first.
    by_version[0]["w1"] = sync("w1", (2, 8), 0, 2.0, 8.0)
    parts = whole_update({0: dict(reversed(list(by_version[0].items()))), 1: by_version[1]})
    assert parts is not None and [p.device_id for p in parts] == ["central", "w1"]
    torch.testing.assert_close(summed(parts)["w"], torch.full((2,), 3.0))
    own = {"bn.running_mean": torch.zeros(2), "bn.num_batches_tracked": torch.tensor(3)}
    means = averaged_buffers(own, parts)
    assert set(means) == {"bn.running_mean"}  # the integer counter is each member's own
    torch.testing.assert_close(means["bn.running_mean"], torch.full((2,), 6.0))  # 2/8 * 0 + 6/8 * 8
    assert averaged_buffers(own, parts[:1]) == {}
