"""Hybrid stages, pure parts: row splits, row buffers, groups and their failover, tilings, deferred
updates (the members' gradients add up to the whole batch's), and a helper's part in a switch."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from edgeagent.pipeline.groups import Groups, cover
from edgeagent.pipeline.rows import RowBuffer, rows_of, split_rows
from edgeagent.pipeline.stage import Stage, StageModule
from edgeagent.protocol.messages import Repartition
from edgeagent.protocol.options import TrainOptions
from edgeagent.replication.store import WeightStore
from edgeagent.replication.switch import Switch


@pytest.mark.parametrize("total", [1, 2, 3, 7, 32, 33, 256])
@pytest.mark.parametrize(
    "shares", [[1.0], [0.5, 0.5], [0.2, 0.8], [0.1, 0.1, 0.8], [1 / 3] * 3, [0.97, 0.01, 0.01, 0.01]]
)
def test_split_rows_tiles_the_batch_in_proportion(total: int, shares: list[float]) -> None:
    rows = split_rows(total, shares)
    assert len(rows) == len(shares)
    assert rows[0][0] == 0 and rows[-1][1] == total
    assert all(a[1] == b[0] for a, b in itertools.pairwise(rows))
    if total >= len(shares):
        assert all(hi > lo for lo, hi in rows)  # every member has something to compute
    for (lo, hi), share in zip(rows, shares, strict=True):
        assert abs((hi - lo) - share * total) <= len(shares)  # rounding, and the one-row floor
    assert rows_of(total, shares, len(shares) - 1) == rows[-1]


def test_split_rows_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="at least one share"):
        split_rows(4, [])
    with pytest.raises(ValueError, match="positive sum"):
        split_rows(4, [0.0, 0.0])
    with pytest.raises(ValueError, match="rows: must be >= 0"):
        split_rows(-1, [1.0])


def test_row_buffer_collects_pieces_whatever_their_split() -> None:
    x = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    buffer = RowBuffer(10)
    assert buffer.add(0, 3, {"x": x[0:3]}) is None
    assert buffer.covers(0, 3) and not buffer.covers(0, 4) and not buffer.complete
    assert buffer.add(6, 10, {"x": x[6:10]}) is None
    assert buffer.add(2, 7, {"x": x[2:7] + 100}) is None  # overlapping: the first value of a row wins
    assert buffer.complete
    got = buffer.take(0, 10)["x"]
    expected = x.clone()
    expected[3:6] += 100  # only rows 3..5 were new in the overlapping piece
    torch.testing.assert_close(got, expected)
    assert "outside" in (buffer.add(8, 11, {"x": x[:3]}) or "")
    assert "rows" in (buffer.add(0, 2, {"x": x[:3]}) or "")
    assert "earlier rows" in (buffer.add(0, 2, {"x": torch.zeros(2, 5)}) or "")
    with pytest.raises(ValueError, match="not all here"):
        RowBuffer(4).take(0, 2)


def test_groups_failover_keeps_relative_shares_and_promotes_the_next_member() -> None:
    groups = Groups((("c",), ("a", "b", "d"), ("e",)), ((1.0,), (0.5, 0.25, 0.25), (1.0,)))
    assert groups.primaries == ["c", "a", "e"] and groups.replicated == [1]
    after, changed = groups.without(["a"])
    assert changed == [1] and after.version == 1
    assert after.members[1] == ("b", "d") and after.shares[1] == (0.5, 0.5)
    assert after.primaries == ["c", "b", "e"]
    assert groups.orphaned(["e"]) == [2] and groups.orphaned(["a", "b"]) == []
    same, none = groups.without(["e"])  # a stage with nobody left is not a failover
    assert none == [] and same is groups
    assert groups.rows(1, "d", 8) == (6, 8)
    with pytest.raises(ValueError, match="more than one stage"):
        Groups((("c",), ("a", "c")), ((1.0,), (0.5, 0.5)))
    with pytest.raises(ValueError, match="sum to 1"):
        Groups((("c",), ("a", "b")), ((1.0,), (0.5, 0.6)))


def test_cover_finds_one_tiling_deterministically() -> None:
    assert cover([(0, 4), (4, 8)], 8) == [(0, 4), (4, 8)]
    assert cover([(0, 4)], 8) is None
    # An old split and a new one after a failover: the longest piece first, the same on every device.
    assert cover([(4, 8), (0, 4), (0, 8)], 8) == [(0, 8)]
    assert cover([(0, 3), (4, 8), (3, 6)], 8) is None


def _stage(seed: int = 0) -> Stage:
    torch.manual_seed(seed)
    module = StageModule({0: nn.Linear(6, 5), 1: nn.Sequential(nn.ReLU(), nn.Linear(5, 3))})
    return Stage(module, TrainOptions(learning_rate=0.1, momentum=0.9), is_first=False, is_last=True)


def test_members_gradients_add_up_to_the_whole_batch() -> None:
    """Two members of the last stage, each with some rows, deferring their updates: the summed update
    equals the whole batch's on one stage (the basis of the hybrid mode's exactness)."""
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    whole, a, b = _stage(), _stage(), _stage()
    whole.forward(0, x)
    result = whole.backward(0, labels=y)
    parts = []
    for member, (lo, hi) in ((a, (0, 5)), (b, (5, 8))):
        member.pin(0, 0)
        member.forward(0, x[lo:hi], 0)
        part = member.backward(0, labels=y[lo:hi], total=8, defer=True)
        assert member.version == 0 and part.param_grads is not None and part.row_loss is not None
        parts.append(part)
    grads = [p.param_grads for p in parts if p.param_grads is not None]
    summed = {k: grads[0][k] + grads[1][k] for k in grads[0]}
    for member in (a, b):
        member.apply_gradients(summed)
        member.unpin(0)
        assert member.version == 1
        for (name, p), (_, q) in zip(
            member.module.named_parameters(), whole.module.named_parameters(), strict=True
        ):
            torch.testing.assert_close(p, q, msg=name)
    loss = sum(float(p.row_loss.sum()) for p in parts if p.row_loss is not None) / 8
    assert loss == pytest.approx(result.loss, rel=1e-6)
    with pytest.raises(Exception, match="gradients for"):
        a.apply_gradients({})


def test_a_helper_fetches_what_its_primary_ends_up_with() -> None:
    """Re-split [0, 2, 4] on (c, w1) to [0, 1, 4] with w1 and helper h on stage 1: w1 keeps layers 2-3 and
    fetches layer 1 from c; the helper fetches layers 2-3 from w1 and layer 1 from c."""
    order = Repartition(
        run_id="r",
        plan_id=2,
        points=[0, 1, 4],
        worker_list=["c", "w1"],
        previous_points=[0, 2, 4],
        previous_workers=["c", "w1"],
        version=10,
        groups=[["c"], ["w1", "h"]],
        shares=[[1.0], [0.5, 0.5]],
    )
    from edgeagent.models import ModelSpec

    spec = ModelSpec("mlp", (64,), 10, ())
    switch = Switch.start("h", order, WeightStore("h"), None, spec, 0)
    assert switch is not None
    assert (switch.plan.start, switch.plan.end, switch.plan.stage) == (1, 4, 1)
    assert switch.pending == {("c", "c"): {1}, ("w1", "w1"): {2, 3}}
    assert Switch.start("x", order, WeightStore("x"), None, spec, 0) is None  # not in the plan


def test_groups_as_planner_indices_keep_each_members_share() -> None:
    groups = Groups((("central",), ("w2", "w1", "w3")), ((1.0,), (0.5, 0.3, 0.2)))
    index = {"central": 0, "w1": 1, "w2": 2, "w3": 3}
    assert groups.indexed(index) == ([[0], [1, 2, 3]], [[1.0], [0.3, 0.5, 0.2]])
    with pytest.raises(KeyError):
        groups.indexed({"central": 0, "w1": 1})
