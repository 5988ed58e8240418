"""StageStep: one stage's forward, backward and evaluation with what they send and the fault hooks,
on real stages and a fake send that records (no broker, no process)."""

from __future__ import annotations

import math

import pytest
import torch

from edgeagent.errors import TrainingError
from edgeagent.models import ModelSpec, build_layers
from edgeagent.pipeline.runner import GradientPiece, StageRunner
from edgeagent.pipeline.stage import Stage, StageModule
from edgeagent.pipeline.step import NO_FAULTS, StageStep
from edgeagent.protocol.messages import Activation, EvalResult, Gradient, Message
from edgeagent.protocol.options import TrainOptions
from edgeagent.protocol.topics import Topics
from edgeagent.runtime.compute import TimeAccount

SPEC = ModelSpec("cnn", (1, 8, 8), 10)
POINTS = [0, 4, 8]  # two stages: the first, and the last
TOPICS = Topics("site")
PAYLOAD = 1234  # what the fake send says it published


class Sent:
    """A fake send: records every (topic, message), says it published PAYLOAD bytes."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, Message]] = []

    def __call__(self, topic: str, message: Message) -> int:
        self.messages.append((topic, message))
        return PAYLOAD


class Faults:
    """Records the fault hooks called; ``nan`` names the kind of message whose tensor is poisoned."""

    def __init__(self, nan: str = "") -> None:
        self.calls: list[tuple[str, int]] = []
        self.nan = nan

    def fault_at_backward(self, batch_id: int) -> None:
        self.calls.append(("backward", batch_id))

    def fault_at_evaluation(self, batch_id: int) -> None:
        self.calls.append(("evaluation", batch_id))

    def poisoned(self, kind: str, batch: int, tensor: torch.Tensor) -> torch.Tensor:
        self.calls.append((kind, batch))
        return torch.full_like(tensor, math.nan) if kind == self.nan else tensor


OPTIONS = TrainOptions(learning_rate=0.05)


def make_stage(index: int) -> Stage:
    n = len(POINTS) - 1
    layers = build_layers(SPEC, POINTS[index], POINTS[index + 1], seed=0)
    module = StageModule({POINTS[index] + k: layer for k, layer in enumerate(layers)})
    return Stage(module, OPTIONS, is_first=index == 0, is_last=index == n - 1)


def make_step(faults: Faults | None = None) -> tuple[StageStep, Sent, TimeAccount]:
    sent, account = Sent(), TimeAccount()
    step = StageStep(sent, TOPICS, "w1", account, faults if faults is not None else NO_FAULTS)
    return step, sent, account


def batch(rows: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, *SPEC.in_shape, generator=g), torch.randint(0, 10, (rows,), generator=g)


def first_output(x: torch.Tensor) -> torch.Tensor:
    """Stage 0's output of ``x`` computed directly, on a stage built the same way."""
    out, _ = make_stage(0).forward(0, x)
    return out


def test_forward_sends_the_output_on_as_an_activation_and_counts_its_compute() -> None:
    faults = Faults()
    step, sent, account = make_step(faults)
    runner = StageRunner(make_stage(0), 0)
    x, y = batch()
    result = step.forward(runner, 7, x, y, run_id="r", plan_id=2, slowdown=1.0, epoch=3, batch=1)
    assert result is None
    [(topic, msg)] = sent.messages
    assert topic == TOPICS.activations(0, "w1")
    assert isinstance(msg, Activation)
    assert (msg.run_id, msg.plan_id, msg.stage, msg.batch_id, msg.version, msg.mode) == (
        "r",
        2,
        0,
        7,
        0,
        "train",
    )
    assert torch.equal(msg.tensor, first_output(x)) and msg.y is y
    assert msg.rows == [] and msg.total == 0
    # Its gradient must have the output's shape; the step's time is the batch's so far and the device's.
    assert runner.outputs[7] == (tuple(msg.tensor.shape), msg.tensor.dtype)
    assert runner.step_seconds > 0 and account.compute == pytest.approx(runner.step_seconds)
    assert runner.codecs.message_bytes == PAYLOAD
    assert faults.calls == [("activation", 1)]  # the fault hooks count ``batch``, not the item


def test_forward_of_rows_names_them_and_total_goes_only_with_rows() -> None:
    step, sent, _ = make_step()
    runner = StageRunner(make_stage(0), 0)
    x, y = batch(4)
    step.forward(runner, 0, x, y, run_id="r", plan_id=0, slowdown=1.0, epoch=0, rows=[2, 6], total=10)
    step.forward(runner, 1, x, y, run_id="r", plan_id=0, slowdown=1.0, epoch=0, rows=[], total=10)
    pieces = [m for _, m in sent.messages]
    assert isinstance(pieces[0], Activation) and (pieces[0].rows, pieces[0].total) == ([2, 6], 10)
    assert isinstance(pieces[1], Activation) and (pieces[1].rows, pieces[1].total) == ([], 0)


def test_forward_sends_what_the_fault_hook_poisons() -> None:
    faults = Faults(nan="activation")
    step, sent, _ = make_step(faults)
    runner = StageRunner(make_stage(0), 0)
    x, y = batch()
    step.forward(runner, 0, x, y, run_id="r", plan_id=0, slowdown=1.0, epoch=0)
    [(_, msg)] = sent.messages
    assert isinstance(msg, Activation) and torch.isnan(msg.tensor).all()


def test_last_stage_forward_ends_in_its_backward_and_sends_nothing() -> None:
    faults = Faults()
    step, sent, account = make_step(faults)
    runner = StageRunner(make_stage(1), 1)
    x, y = batch()
    inputs = first_output(x)
    result = step.forward(
        runner, 5, inputs, y, run_id="r", plan_id=0, slowdown=1.0, epoch=0, version=0, batch=2
    )
    assert result is not None and math.isfinite(result.loss) and result.grad_input is not None
    assert result.grad_input.shape == inputs.shape
    assert sent.messages == []
    assert faults.calls == [("backward", 2)]  # --die-at-backward between the forward and the backward
    assert runner.stage.in_flight == [] and runner.step_seconds > 0 and account.compute > 0


def test_last_stage_forward_of_rows_defers_the_update() -> None:
    step, _, _ = make_step()
    runner = StageRunner(make_stage(1), 1)
    before = {k: v.clone() for k, v in runner.stage.state().items()}
    x, y = batch(4)
    result = step.forward(
        runner, 0, first_output(x), y, run_id="r", plan_id=0, slowdown=1.0, epoch=0, version=0,
        rows=[0, 4], total=8, defer=True,
    )  # fmt: skip
    assert result is not None and result.param_grads and result.row_loss is not None
    assert result.row_loss.shape == (4,)
    assert result.loss == pytest.approx(float(result.row_loss.sum()) / 8)  # over the whole batch's rows
    after = runner.stage.state()
    assert all(torch.equal(before[k], after[k]) for k in before)  # deferred: not applied


def test_the_central_nodes_only_stage_leaves_the_backward_for_later() -> None:
    """A one-stage run on the central node: forward only; its backward comes when the loop is ready."""
    layers = build_layers(SPEC, 0, 8, seed=0)
    stage = Stage(StageModule(dict(enumerate(layers))), OPTIONS, is_first=True, is_last=True)
    step, sent, _ = make_step()
    runner = StageRunner(stage, 0)
    x, y = batch()
    assert (
        step.forward(runner, 0, x, y, run_id="r", plan_id=0, slowdown=1.0, epoch=0, loss_here=False) is None
    )
    assert sent.messages == [] and stage.in_flight == [0] and runner.step_seconds > 0
    result = step.backward(runner, 0, slowdown=1.0, labels=y)
    assert math.isfinite(result.loss) and stage.in_flight == []


def test_a_loss_that_is_not_finite_is_returned_and_its_compute_not_counted() -> None:
    step, _, account = make_step()
    runner = StageRunner(make_stage(1), 1)
    x, y = batch()
    inputs = torch.full_like(first_output(x), math.nan)
    result = step.forward(runner, 0, inputs, y, run_id="r", plan_id=0, slowdown=1.0, epoch=0, version=0)
    assert result is not None and not math.isfinite(result.loss)
    assert runner.step_seconds == 0.0 and account.compute == 0.0


def test_backward_takes_the_batch_out_of_flight_and_sends_its_gradient() -> None:
    faults = Faults()
    step, sent, _ = make_step(faults)
    runner = StageRunner(make_stage(1), 1)
    x, y = batch()
    step_first, _, _ = make_step()
    first = StageRunner(make_stage(0), 0)
    step_first.forward(first, 3, x, y, run_id="r", plan_id=0, slowdown=1.0, epoch=0)
    result = step.forward(
        runner, 3, first_output(x), y, run_id="r", plan_id=0, slowdown=1.0, epoch=0, version=0
    )
    assert result is not None and 3 in first.outputs
    back = step_first.backward(first, 3, slowdown=1.0, grad_output=result.grad_input, batch=1)
    assert back.grad_input is None and 3 not in first.outputs  # stage 0: no input gradient
    runner.batch_done()
    step.send_gradient(
        runner, result.grad_input, run_id="r", plan_id=0, batch_id=3, loss=result.loss,
        correct=result.correct, downstream=[0.5], batch=1,
    )  # fmt: skip
    [(topic, msg)] = sent.messages
    assert topic == TOPICS.gradients(1, "w1") and isinstance(msg, Gradient)
    assert msg.batch_id == 3 and msg.loss == result.loss and msg.correct == result.correct
    assert msg.stage_times == [runner.per_batch(), 0.5] and msg.rows == [] and msg.device_times == {}
    assert result.grad_input is not None and torch.equal(msg.tensor, result.grad_input)
    assert faults.calls == [("backward", 3), ("gradient", 1)]
    assert runner.codecs.message_bytes == PAYLOAD


def test_a_hybrid_members_gradient_carries_its_piece() -> None:
    step, sent, _ = make_step(Faults(nan="gradient"))
    runner = StageRunner(make_stage(1), 1)
    grad = torch.ones(2, 3)
    piece = GradientPiece([4, 6], 8, [0.5, 0.25], [1, 0], {"w1": 0.2})
    step.send_gradient(
        runner, grad, run_id="r", plan_id=1, batch_id=0, loss=0.75 / 8, correct=1, downstream=[], piece=piece
    )
    [(_, msg)] = sent.messages
    assert isinstance(msg, Gradient) and torch.isnan(msg.tensor).all()
    assert (msg.rows, msg.total, msg.row_loss, msg.row_correct) == ([4, 6], 8, [0.5, 0.25], [1, 0])
    assert msg.device_times == {"w1": 0.2}


def test_no_input_gradient_is_an_error() -> None:
    step, sent, _ = make_step()
    runner = StageRunner(make_stage(1), 1)
    with pytest.raises(TrainingError, match="no input gradient"):
        step.send_gradient(
            runner, None, run_id="r", plan_id=0, batch_id=0, loss=0.0, correct=0, downstream=[]
        )
    assert sent.messages == []


def test_evaluation_sends_the_output_on_without_keeping_it_for_a_gradient() -> None:
    faults = Faults()
    step, sent, account = make_step(faults)
    runner = StageRunner(make_stage(0), 0)
    x, y = batch()
    step.evaluate(runner, 11, x, y, run_id="r", plan_id=0, slowdown=1.0, version=4, rows=[0, 6], total=12)
    [(topic, msg)] = sent.messages
    assert topic == TOPICS.activations(0, "w1") and isinstance(msg, Activation)
    assert (msg.mode, msg.batch_id, msg.version, msg.rows, msg.total) == ("eval", 11, 4, [0, 6], 12)
    assert torch.equal(msg.tensor, make_stage(0).evaluate(x))
    assert runner.outputs == {} and runner.step_seconds == 0.0 and account.compute > 0
    assert faults.calls == [("evaluation", 11)]


def test_the_last_stage_sends_the_evaluation_result() -> None:
    step, sent, _ = make_step()
    runner = StageRunner(make_stage(1), 1)
    x, y = batch()
    inputs = make_stage(0).evaluate(x)
    step.evaluate(runner, 2, inputs, y, run_id="r", plan_id=0, slowdown=1.0, rows=[6, 12], total=12)
    step.evaluate(runner, 3, inputs, y, run_id="r", plan_id=0, slowdown=1.0)
    [(topic, piece), (_, whole)] = sent.messages
    assert topic == TOPICS.results(1, "w1")
    assert isinstance(piece, EvalResult) and isinstance(whole, EvalResult)
    out = make_stage(1).evaluate(inputs)
    assert piece.count == 6 and piece.correct == int((out.argmax(dim=1) == y).sum())
    assert piece.loss_sum == pytest.approx(float(torch.nn.functional.cross_entropy(out, y, reduction="sum")))
    assert (piece.rows, piece.total) == ([6, 12], 12) and (whole.rows, whole.total) == ([], 0)


def test_no_faults_changes_nothing() -> None:
    t = torch.ones(3)
    assert NO_FAULTS.poisoned("activation", 0, t) is t
    NO_FAULTS.fault_at_backward(0)
    NO_FAULTS.fault_at_evaluation(0)
