"""The dead stage brought forward from its replica (pipeline/catchup.py), offline: no broker."""

from __future__ import annotations

import pytest
import torch

from edgeagent.errors import TrainingError
from edgeagent.models import ModelSpec
from edgeagent.pipeline.build import make_stage
from edgeagent.pipeline.catchup import LostBatch, Pieces, catch_up, replay
from edgeagent.pipeline.stage import Stage
from edgeagent.protocol.messages import Activation, Gradient, Ready
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
    _assert_same(rebuilt, s1, range(2, 4))
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


def _train(
    points: list[int], dead: int, replica_at: int, batches: int
) -> tuple[
    list[Stage],
    tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]],
    list[dict[int, torch.Tensor]],
    torch.Tensor,
]:
    """A fault-free run of ``len(points) - 1`` stages, one batch in flight; returns the stages, stage
    ``dead``'s replica at version ``replica_at``, per batch what ``dead`` got (its input, the gradient of
    its output) and gave back (the gradient of its input), and the labels."""
    n = len(points) - 1
    torch.manual_seed(0)
    xs, ys = torch.randn(batches, 4, 1, 8, 8), torch.randint(0, 10, (batches, 4))
    stages = [
        make_stage(SPEC, seed=0, start=points[i], end=points[i + 1], index=i, num_stages=n, options=OPTIONS,
                   in_flight=1)
        for i in range(n)
    ]  # fmt: skip
    inputs: dict[int, torch.Tensor] = {}
    out_grads: dict[int, torch.Tensor] = {}
    in_grads: dict[int, torch.Tensor] = {}
    replica = None
    for b in range(batches):
        if b == replica_at:
            replica = stages[dead].export(range(points[dead], points[dead + 1]))
        x, v = xs[b], None
        for i, stage in enumerate(stages):
            if i == dead:
                inputs[b] = x
            x, v = stage.forward(b, x, v)
        g: torch.Tensor | None = None
        for i in reversed(range(n)):
            if i == dead and g is not None:
                out_grads[b] = g
            result = (
                stages[i].backward(b, labels=ys[b]) if i == n - 1 else stages[i].backward(b, grad_output=g)
            )
            g = result.grad_input
            if i == dead:
                assert g is not None
                in_grads[b] = g
    assert replica is not None
    return stages, replica, [inputs, out_grads, in_grads], ys


def _assert_same(rebuilt: Stage, live: Stage, layers: range) -> None:
    live_w, live_m = live.export(layers)
    got_w, got_m = rebuilt.export(layers)
    assert live_w.keys() == got_w.keys() and live_m.keys() == got_m.keys()
    for key in live_w:
        assert torch.equal(got_w[key], live_w[key]), key
    for key in live_m:
        assert torch.equal(got_m[key], live_m[key]), key


def test_a_dead_last_stage_is_replayed_from_the_labelled_activations_alone() -> None:
    """The last stage has no successor: its lost batches' loss comes from the labels that ride with the
    activations. Replaying 5..11 on its replica gives its weights, momentum, input gradients and losses."""
    points = [0, 2, 4, 8]
    stages_, (weights, momentum), (inputs, _, in_grads), ys = _train(points, dead=2, replica_at=5, batches=12)
    rebuilt = make_stage(SPEC, seed=0, start=4, end=8, index=2, num_stages=3, options=OPTIONS,
                         weights=weights, momentum_buffers=momentum, version=5, in_flight=1)  # fmt: skip
    results = replay(rebuilt, [LostBatch(b, inputs[b], b, labels=ys[b]) for b in range(5, 12)])
    assert rebuilt.version == stages_[2].version == 12
    _assert_same(rebuilt, stages_[2], range(4, 8))
    for b, result in zip(range(5, 12), results, strict=True):
        assert result.grad_input is not None and torch.equal(result.grad_input, in_grads[b])
        assert result.loss > 0 and 0 <= result.correct <= 4


def test_a_dead_middle_stage_of_four_is_replayed_from_both_neighbours_logs() -> None:
    """Stage 2 of 4: its input from stage 1 (a worker's log), its output gradients from stage 3."""
    points = [0, 2, 3, 5, 8]
    stages_, (weights, momentum), (inputs, out_grads, in_grads), _ = _train(
        points, dead=2, replica_at=5, batches=12
    )
    rebuilt = make_stage(SPEC, seed=0, start=3, end=5, index=2, num_stages=4, options=OPTIONS,
                         weights=weights, momentum_buffers=momentum, version=5, in_flight=1)  # fmt: skip
    grads = catch_up(rebuilt, [LostBatch(b, inputs[b], b, grad_output=out_grads[b]) for b in range(5, 12)])
    assert rebuilt.version == stages_[2].version == 12
    _assert_same(rebuilt, stages_[2], range(3, 5))
    for b, g in zip(range(5, 12), grads, strict=True):
        assert g is not None and torch.equal(g, in_grads[b])


def test_a_batch_with_both_labels_and_an_output_gradient_is_refused() -> None:
    stage = stages()[1]
    x = torch.randn(4, *SPEC.in_shape)
    with pytest.raises(TrainingError, match="not both"):
        replay(stage, [LostBatch(0, x, 0, grad_output=torch.zeros(1), labels=torch.zeros(4))])


def _pieces(successor: str | None, predecessor: str | None) -> Pieces:
    pieces = Pieces("w2", 2, "w3", successor, predecessor, 5, 1, [3, 4])
    pieces.weights = {}
    return pieces


def _ready(device: str, version: int, sent: int = -1) -> Ready:
    return Ready(run_id="r", plan_id=1, device_id=device, stage=0, parameters=0, phase="resent",
                 version=version, sent=sent)  # fmt: skip


def _activation(batch: int, stage: int = 1) -> Activation:
    return Activation(run_id="r", plan_id=1, stage=stage, batch_id=batch, version=batch, mode="train",
                      x=torch.zeros(1), y=torch.zeros(1, dtype=torch.long))  # fmt: skip


def _gradient(batch: int, stage: int = 3) -> Gradient:
    return Gradient(run_id="r", plan_id=1, stage=stage, batch_id=batch, g=torch.zeros(1), loss=0.0, correct=0,
                    stage_times=[])  # fmt: skip


def test_the_pieces_of_a_dead_last_stage_end_where_the_stage_before_stopped_sending() -> None:
    pieces = _pieces(successor=None, predecessor="w1")
    assert not pieces.accept_gradient(_gradient(6))  # nothing comes from after the last stage
    assert not pieces.accept_activation(_activation(4))  # before the replica
    assert not pieces.accept_activation(_activation(6, stage=2))  # not the stage before
    for b in range(5, 8):
        assert pieces.accept_activation(_activation(b))
    assert not pieces.complete and pieces.until is None
    pieces.resent(_ready("w1", version=5, sent=9))  # it sent 8 too, not here yet
    assert pieces.until == 9 and not pieces.complete
    assert pieces.accept_activation(_activation(8))
    assert pieces.complete and pieces.before == 5


def test_the_pieces_of_a_dead_middle_stage_need_both_neighbours() -> None:
    pieces = _pieces(successor="w3", predecessor="w1")
    for b in range(5, 8):
        assert pieces.accept_activation(_activation(b)) and pieces.accept_gradient(_gradient(b))
    pieces.resent(_ready("w3", version=8))
    assert pieces.until == 8 and not pieces.complete  # the stage before has not said where it stands
    pieces.resent(_ready("w1", version=6, sent=10))  # it sent 8 and 9 too: lost with the dead stage
    assert pieces.complete and pieces.until == 8
