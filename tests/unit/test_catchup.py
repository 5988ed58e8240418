"""The dead stage brought forward from its replica (pipeline/catchup.py), offline: no broker."""

from __future__ import annotations

import pytest
import torch

from edgeagent.errors import TrainingError
from edgeagent.models import ModelSpec
from edgeagent.pipeline.build import make_stage
from edgeagent.pipeline.catchup import LostBatch, catch_up
from edgeagent.pipeline.stage import Stage
from edgeagent.protocol.options import TrainOptions

SPEC = ModelSpec("cnn", (1, 8, 8), 10)
POINTS = [0, 2, 4, 8]
OPTIONS = TrainOptions(learning_rate=0.1, momentum=0.9, staleness="none")


def stages() -> list[Stage]:
    return [
        make_stage(SPEC, seed=0, start=POINTS[i], end=POINTS[i + 1], index=i, num_stages=3, options=OPTIONS,
                   in_flight=1)
        for i in range(3)
    ]  # fmt: skip


def test_replaying_the_lost_batches_on_the_replica_gives_the_dead_stage_s_weights_and_gradients() -> None:
    """One batch in flight: train 12 batches, keep stage 1's replica at version 5 and what its neighbours
    sent it; replaying 5..11 on the replica gives its weights, momentum and input gradients exactly."""
    torch.manual_seed(0)
    xs, ys = torch.randn(12, 4, 1, 8, 8), torch.randint(0, 10, (12, 4))
    s0, s1, s2 = stages()
    inputs: dict[int, torch.Tensor] = {}
    out_grads: dict[int, torch.Tensor] = {}
    in_grads: dict[int, torch.Tensor] = {}
    replica = None
    for b in range(12):
        if b == 5:
            replica = s1.export(range(POINTS[1], POINTS[2]))
        a0, v = s0.forward(b, xs[b])
        a1, _ = s1.forward(b, a0, v)
        s2.forward(b, a1, v)
        g2 = s2.backward(b, labels=ys[b]).grad_input
        assert g2 is not None
        g1 = s1.backward(b, grad_output=g2).grad_input
        assert g1 is not None
        s0.backward(b, grad_output=g1)
        inputs[b], out_grads[b], in_grads[b] = a0, g2, g1
    assert replica is not None
    weights, momentum = replica
    rebuilt = make_stage(SPEC, seed=0, start=2, end=4, index=1, num_stages=3, options=OPTIONS,
                         weights=weights, momentum_buffers=momentum, version=5, in_flight=1)  # fmt: skip
    grads = catch_up(rebuilt, [LostBatch(b, inputs[b], b, grad_output=out_grads[b]) for b in range(5, 12)])
    assert rebuilt.version == s1.version == 12
    live_w, live_m = s1.export(range(2, 4))
    got_w, got_m = rebuilt.export(range(2, 4))
    for key in live_w:
        assert torch.equal(got_w[key], live_w[key]), key
    for key in live_m:
        assert torch.equal(got_m[key], live_m[key]), key
    for b, g in zip(range(5, 12), grads, strict=True):
        assert g is not None and torch.equal(g, in_grads[b])


def test_a_gap_in_the_lost_batches_is_refused() -> None:
    stage = stages()[1]
    x = torch.randn(4, *SPEC.in_shape)
    with pytest.raises(TrainingError, match="catch-up at version 0 got batch 1"):
        catch_up(stage, [LostBatch(1, x, 0, grad_output=torch.zeros(1))])


def test_the_log_covers_two_chain_periods_and_the_batches_in_flight_within_its_cap() -> None:
    from edgeagent.pipeline.runner import MAX_LOGGED, log_bound

    assert log_bound(50, 3) == 103  # the defaults with 3 devices
    assert log_bound(0, 3) == 0  # no chain replication: nothing to replay from
    assert log_bound(1567, 3) == MAX_LOGGED  # a long period (--chain-seconds before its retune)


def test_the_log_drops_its_oldest_batch_also_after_a_batch_out_of_order() -> None:
    from edgeagent.pipeline.runner import StageRunner

    runner = StageRunner(stages()[1], 1, log_keep=3)
    for batch_id in (4, 5, 6, 7):  # in order: the first key is the oldest
        runner.gradient(
            torch.zeros(2), run_id="r", plan_id=1, batch_id=batch_id, loss=0.0, correct=0, downstream=[]
        )
    assert list(runner.sent_gradients) == [5, 6, 7]
    for batch_id in (2, 8, 9):  # 2 came after 7 (a replay): from then on the oldest is looked for
        runner.gradient(
            torch.zeros(2), run_id="r", plan_id=1, batch_id=batch_id, loss=0.0, correct=0, downstream=[]
        )
    assert sorted(runner.sent_gradients) == [7, 8, 9]
