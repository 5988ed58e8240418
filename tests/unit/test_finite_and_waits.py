"""Issue 49's pure parts: what is not finite is refused at intake, every mid-run wait is derived from the
bytes it moves and each device's own heartbeat interval, recoveries without progress are bounded, and
evaluation batches are taken only while an evaluation can be in progress (no broker)."""

from __future__ import annotations

import math

import pytest
import torch

from edgeagent.compression import Compressed, CompressionError
from edgeagent.compression.stage import StageCodecs, restore
from edgeagent.config import WorkerConfig
from edgeagent.errors import ConfigError
from edgeagent.injected import parse_send_nan
from edgeagent.models import ModelSpec
from edgeagent.modes.allreduce.messages import AllreduceDone, AllreduceMsg, AllreduceStep
from edgeagent.modes.pipeline.worker.run import Run
from edgeagent.modes.splitfed.messages import SplitActivation, SplitGradient, SplitRound, SplitUpdate
from edgeagent.pipeline.build import build_stage
from edgeagent.pipeline.runner import StageRunner
from edgeagent.planner.deadlines import MAX_HEARTBEAT_INTERVAL, Deadlines, reassembly_stall, silence
from edgeagent.planner.recovery import RECOVERIES_WITHOUT_PROGRESS, Stalls
from edgeagent.planner.redistribute import bytes_sent, redistribution_plan
from edgeagent.protocol.limits import NONFINITE, nonfinite_problem
from edgeagent.protocol.messages import Activation, GradSync, Heartbeat, Message, Weights
from edgeagent.protocol.options import TrainOptions
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode, encode
from edgeagent.runtime.role import Role
from edgeagent.transport.memory import MemoryBroker, MemoryTransport

NAN = math.nan

# -- finite or refused -----------------------------------------------------------------------------


def _activation(x: torch.Tensor | Compressed, mode: str = "train", batch_id: int = 0) -> Activation:
    y = torch.zeros(4, dtype=torch.int64)
    return Activation(run_id="r", plan_id=0, stage=0, batch_id=batch_id, version=0, mode=mode, x=x, y=y)  # type: ignore[arg-type]


def test_a_tensor_that_is_not_finite_is_named_with_its_field() -> None:
    assert nonfinite_problem(_activation(torch.randn(4, 8))) is None
    x = torch.randn(4, 8)
    x[1, 2], x[3, 3] = NAN, math.inf
    problem = nonfinite_problem(_activation(x))
    assert problem == "x holds values that are not finite (1 NaN and 1 infinite of 32 values)"
    grads = {"layers.1.weight": torch.ones(2, 2), "layers.1.bias": torch.tensor([1.0, -math.inf])}
    sync = GradSync(
        run_id="r",
        plan_id=0,
        stage=1,
        batch_id=3,
        share_version=0,
        device_id="w",
        rows=[0, 2],
        total=4,
        grads=grads,
    )
    assert nonfinite_problem(sync) == (
        "grads['layers.1.bias'] holds values that are not finite (0 NaN and 1 infinite of 2 values)"
    )


def _poisoned() -> torch.Tensor:
    t = torch.ones(6)
    t[4] = NAN
    return t


@pytest.mark.parametrize(
    "message",
    [
        # hybrid: a replicated stage's gradient sums and its normalisation buffers
        GradSync(
            run_id="r",
            plan_id=0,
            stage=1,
            batch_id=3,
            share_version=0,
            device_id="w",
            rows=[0, 2],
            total=4,
            grads={"layers.1.weight": torch.ones(2)},
            buffers={"layers.1.running_mean": _poisoned()},
        ),
        # allreduce: a collective's message, a joiner's model, rank 0's collected weights
        AllreduceMsg(run_id="r", step=0, attempt=0, kind="data_reduce", sender=1, data=_poisoned()),
        AllreduceStep(run_id="r", step=0, attempt=0, members=["w"], weights=_poisoned()),
        AllreduceDone(
            run_id="r",
            device_id="w",
            step=0,
            attempt=0,
            digest="0",
            loss=0.0,
            samples=1,
            contributors=[0],
            weights=_poisoned(),
        ),
        # split-federated: both directions of an iteration, the round and the update
        SplitActivation(
            run_id="r", epoch=0, iteration=0, micro=0, x=_poisoned(), y=torch.zeros(6, dtype=torch.int64)
        ),
        SplitGradient(run_id="r", epoch=0, iteration=0, micro=0, g=_poisoned(), loss=0.0),
        SplitRound(run_id="r", epoch=0, split=1, parallel=1, batch_size=2, tensors={"0.weight": _poisoned()}),
        SplitUpdate(
            run_id="r", epoch=0, device_id="w", samples=2, iterations=1, tensors={"0.weight": _poisoned()}
        ),
    ],
    ids=lambda m: type(m).__name__,
)
def test_every_mode_refuses_what_is_not_finite(message: Message) -> None:
    problem = nonfinite_problem(message)
    assert problem is not None and "1 NaN and 0 infinite of 6 values" in problem


def test_weights_and_momentum_are_checked_and_integer_tensors_cannot_be_nan() -> None:
    weights = Weights(
        run_id="r",
        device_id="w",
        stage=1,
        start=1,
        end=2,
        version=20,
        tensors={"layers.1.weight": torch.ones(3), "layers.1.num_batches_tracked": torch.tensor(5)},
        purpose="global",
        optimizer={"layers.1.weight": torch.tensor([0.0, NAN, 1.0])},
    )
    assert nonfinite_problem(weights) == (
        "optimizer['layers.1.weight'] holds values that are not finite (1 NaN and 0 infinite of 3 values)"
    )


def test_a_compressed_tensor_that_restores_to_values_that_are_not_finite_is_refused() -> None:
    codecs = StageCodecs()
    codecs.set_bits(4, 8)
    packed = codecs.activation(torch.randn(4, 8), epoch=0, train=True)
    assert isinstance(packed, Compressed)
    assert torch.isfinite(restore(packed)).all()
    # Finite parameters (the decoder checks those) can still overflow float32 when restored.
    alpha = [3e38 * a for a in packed.params["alpha"]]
    huge = Compressed(
        packed.codec, packed.shape, packed.dtype, {**packed.params, "alpha": alpha}, packed.data
    )
    with pytest.raises(CompressionError, match="not finite"):
        restore(huge)


def _role(broker: MemoryBroker) -> tuple[Role, list[tuple[str, str]]]:
    topics = Topics("nf")
    told: list[tuple[str, str]] = []

    class Telling(Role):
        def on_nonfinite(self, sender: str, message: Message, problem: str) -> None:
            told.append((sender, problem))

    role = Telling(MemoryTransport(broker, "me"), topics, "me")
    role.listen(topics.activations(0, "w1"))
    return role, told


def test_the_runtime_drops_a_message_that_is_not_finite_counts_it_and_says_who_sent_it() -> None:
    broker = MemoryBroker()
    role, told = _role(broker)
    x = torch.randn(4, 8)
    x[0, 0] = NAN
    sender = MemoryTransport(broker, "w1")
    sender.publish(Topics("nf").activations(0, "w1"), encode(_activation(x), sender="w1"))
    sender.publish(
        Topics("nf").activations(0, "w1"), encode(_activation(torch.randn(4, 8), batch_id=1), sender="w1")
    )
    item = role.next_message(0)
    assert item is not None and item.message.batch_id == 1  # type: ignore[attr-defined]
    assert role.next_message(0) is None
    assert role.gate.drops[NONFINITE] == 1 and role.dropped == 1
    assert told == [("w1", "x holds values that are not finite (1 NaN and 0 infinite of 32 values)")]


def test_send_nan_names_a_kind_and_a_batch() -> None:
    assert parse_send_nan("gradient@40") == ("gradient", 40, False)
    assert parse_send_nan("replica@80+") == ("replica", 80, True)
    for bad in ("gradient", "loss@3", "activation@-1", "sync@x"):
        with pytest.raises(ConfigError, match="--send-nan"):
            parse_send_nan(bad)
    with pytest.raises(ConfigError, match="--send-nan"):
        WorkerConfig(send_nan="weights@1")


# -- recoveries without progress -----------------------------------------------------------------


def test_recoveries_that_make_no_progress_end_the_run_naming_the_device_that_sends_nan() -> None:
    stalls = Stalls()
    counts = {"worker-1": 2}  # before the fault (another cause, over since)
    assert stalls.fault(39, "gradients of batch 40 are late", counts) is None  # the first: recover
    counts["worker-2"] = 0
    for n in range(1, RECOVERIES_WITHOUT_PROGRESS):
        counts["worker-2"] += 1
        assert stalls.fault(39 - n, "late", counts) is None  # a rollback replays: no further than 39
    counts["worker-2"] += 1
    why = stalls.fault(39, "gradients of batch 40 are late", counts)
    assert why == (
        "worker-2 keeps sending values that are not finite (3 of its messages dropped since batch 40); "
        "the run made no progress past batch 40 in 3 recoveries in a row: check worker-2 (its memory, its "
        "software) or start the run without it"
    )


def test_progress_between_faults_starts_the_count_again() -> None:
    stalls = Stalls(limit=2)
    assert stalls.fault(10, "a", {}) is None
    assert stalls.fault(10, "b", {}) is None
    assert stalls.fault(11, "c", {}) is None  # got past batch 11: a new fault, not the same one
    assert stalls.fault(5, "d", {}) is None
    assert stalls.fault(11, "the last", {}) == (
        "the run made no progress past batch 12 in 2 recoveries in a row; the last fault: the last"
    )


# -- every wait derived ----------------------------------------------------------------------------


def test_a_barrier_waits_for_the_bytes_it_moves_over_the_slowest_link() -> None:
    d = Deadlines(multiplier=4.0, barrier_floor=60.0)
    half_mbit = 0.5e6 / 8  # bytes/s
    assert d.barrier(1e6, 100e6) == 60.0  # a fast link: the floor (what building a stage may take)
    # A MobileNetV2 stage's chain and global replicas (weights and momentum: 7.5 MB) at 0.5 Mbit/s.
    assert d.barrier(7.5e6, half_mbit) == pytest.approx(4 * 120.0)
    assert d.barrier(7.5e6, half_mbit, latency=0.5, queued=10.0) == pytest.approx(4 * 121.0 + 10.0)
    assert d.barrier(1e9, math.inf) == 60.0  # links not measured yet
    with pytest.raises(ValueError):
        d.barrier(-1.0, 1e6)
    with pytest.raises(ValueError):
        Deadlines(barrier_floor=0.0)


def test_silence_follows_the_devices_own_heartbeat_interval() -> None:
    assert silence(1.0, floor=1.0) == 3.0
    assert silence(5.0, floor=1.0) == 15.0  # a device profile's 5 s: 3 of its own intervals
    assert silence(0.1, floor=1.0, slack=2.5) == 5.5  # never stricter than the central node's own
    assert silence(600.0, floor=1.0) == 3 * MAX_HEARTBEAT_INTERVAL  # an announced eternity: capped
    assert silence(0.0, floor=2.0) == 6.0  # none announced yet (no heartbeat seen)
    assert silence(math.nan, floor=1.0, missed=5) == 5.0


def test_a_message_in_chunks_is_given_up_only_when_its_chunks_stop() -> None:
    assert reassembly_stall(0.0) == 60.0  # before a second chunk: the floor
    assert reassembly_stall(12.6) == 60.0  # 768 KiB chunks at 0.5 Mbit/s
    assert reassembly_stall(63.0) == pytest.approx(252.0)  # at 0.1 Mbit/s: 4x the longest gap


def test_a_switch_counts_the_bytes_each_holder_sends() -> None:
    layer_bytes = [100, 200, 300, 400, 500]
    plans = redistribution_plan([0, 2, 4, 5], [0, 1, 3, 5], ["c", "w1", "w2"], ["c", "w1", "w2"])
    # w1 fetches layer 1 from c; w2 fetches layer 3 from w1 and keeps layer 4.
    assert bytes_sent(plans, layer_bytes) == {"c": 2 * 200, "w1": 2 * 400}
    # A replicated stage: its other device fetches the whole new stage (counted as the primary's).
    assert bytes_sent(plans, layer_bytes, helpers={"w1": 1}) == {"c": 400, "w1": 800 + 2 * (200 + 300)}


# -- evaluation batches only during an evaluation ---------------------------------------------------


def _run(next_forward: int, next_backward: int, *, total: int = 100, per_epoch: int = 45) -> Run:
    spec = ModelSpec("mlp", (64,), 10)
    options = TrainOptions(learning_rate=0.1, total_batches=total)
    stage = build_stage(spec, seed=0, options=options, points=[0, 2, 6], index=1)
    return Run(
        "r",
        spec,
        0,
        options,
        0,
        [0, 2, 6],
        ["c", "w1"],
        1,
        StageRunner(stage, 1),
        next_forward=next_forward,
        next_backward=next_backward,
        batches_per_epoch=per_epoch,
        in_flight=3,
    )


def test_evaluation_batches_are_taken_only_with_the_pipeline_drained_at_an_epochs_end() -> None:
    assert _run(45, 45).evaluation_problem() is None  # the end of epoch 0
    assert _run(100, 100).evaluation_problem() is None  # the run's last batch (max_batches)
    assert _run(0, 0).evaluation_problem() is None  # a run resumed at an epoch's end evaluates first
    assert _run(47, 44).evaluation_problem() == "3 training batches are in flight here"
    assert _run(20, 20).evaluation_problem() == "training is at batch 20 here, not at an epoch's end"
    run = _run(20, 20)
    msg = _activation(torch.randn(4, 128), mode="eval", batch_id=256)
    assert run.activation_problem(msg) == (
        "an evaluation batch while no evaluation can be in progress: training is at batch 20 here, "
        "not at an epoch's end"
    )
    run = _run(45, 45)
    assert run.activation_problem(msg) is None
    run.evals = [msg] * run.eval_window
    assert run.activation_problem(msg) == "6 evaluation batches already wait here (at most 6)"


def test_a_new_heartbeat_interval_is_announced_at_once() -> None:
    broker = MemoryBroker()
    topics = Topics("hb")
    beats: list[bytes] = []
    MemoryTransport(broker, "spy").subscribe(
        topics.device(Family.HEARTBEAT, "w"), lambda t, p: beats.append(p)
    )
    role = Role(MemoryTransport(broker, "w"), topics, "w")
    role.pulse.start(30.0)
    try:
        role.pulse.set_heartbeat_interval(60.0)
    finally:
        role.pulse.stop()
    intervals = [m.interval for _, m in map(decode, beats) if isinstance(m, Heartbeat)]
    assert intervals == [30.0, 60.0]
