"""What a role accepts: sizes, rates, inbox caps, log lines that do not flood, senders, and batches that fit.

Pure policy (:class:`InboxGate`) with an injected clock, then roles on the in-memory transport.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

from edgeagent.config import CentralConfig, WorkerConfig
from edgeagent.data import load_dataset
from edgeagent.models import ModelSpec, build_layers, layer_output_shapes
from edgeagent.modes import mode
from edgeagent.modes.pipeline.central.run import PipelineRun
from edgeagent.modes.pipeline.worker.run import Run, stage_input
from edgeagent.modes.pipeline.worker.session import PipelineSession
from edgeagent.planner.profiler import profile_layers
from edgeagent.protocol.commands import Ping
from edgeagent.protocol.limits import (
    MALFORMED,
    OVERSIZE,
    QUEUE,
    RATE,
    SENDER,
    TOPIC_QUEUE,
    InboxGate,
    InboxLimits,
    activation_problem,
    gradient_problem,
    sender_problem,
)
from edgeagent.protocol.messages import (
    Activation,
    ActivationMode,
    EvalResult,
    Gradient,
    Heartbeat,
    Message,
    Probe,
    Status,
)
from edgeagent.protocol.topics import Family, TopicInfo, Topics
from edgeagent.protocol.wire import encode
from edgeagent.roles.central import Central
from edgeagent.roles.worker import Worker
from edgeagent.runtime.probes import LinkProbes
from edgeagent.runtime.role import Inbound, Role
from edgeagent.transport.memory import MemoryBroker, MemoryTransport
from tests.helpers import make_assign

TOPICS = Topics("lim")
HB = TOPICS.device(Family.HEARTBEAT, "w1")
ACT = TOPICS.activations(0, "central")


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# =============================================================================================
# InboxLimits


def test_defaults_separate_the_control_plane_from_the_data_plane() -> None:
    limits = InboxLimits()
    for family in (Family.STATUS, Family.HEARTBEAT, Family.METRICS, Family.ANNOUNCE, Family.COMMAND):
        assert limits.max_bytes(family) == 64 * 1024
        assert limits.bucket(family) == (100.0, 200.0)
    for family in (Family.ACTIVATIONS, Family.GRADIENTS, Family.REPLICA, Family.REPLY, Family.CONTROL):
        assert limits.max_bytes(family) == 256 * 1024 * 1024
        assert limits.bucket(family) == (5000.0, 10000.0)
    assert limits.field_name(Family.HEARTBEAT, "rate") == "control_rate"
    assert limits.field_name(Family.REPLICA, "max_bytes") == "data_max_bytes"


@pytest.mark.parametrize(
    "bad",
    [
        {"control_max_bytes": 0},
        {"max_queued": 0},
        {"data_rate": 0.0},
        {"control_rate": float("inf")},
        {"data_burst": 0.5},
        {"max_topics": 0},
        {"log_first": -1},
        {"log_interval": float("nan")},
    ],
)
def test_limits_reject_values_that_would_drop_everything(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        InboxLimits(**bad)  # type: ignore[arg-type]


# =============================================================================================
# Size


def test_oversized_payload_is_dropped_by_its_family_limit() -> None:
    gate = InboxGate(InboxLimits(control_max_bytes=100, data_max_bytes=1000), name="dev")
    assert gate.admit(HB, Family.HEARTBEAT, 100, 0.0).accepted  # at the limit: fine
    verdict = gate.admit(HB, Family.HEARTBEAT, 101, 0.0)
    assert verdict.reason == OVERSIZE
    assert verdict.log is not None
    assert HB in verdict.log and "101-byte" in verdict.log and "100-byte limit" in verdict.log
    assert "InboxLimits.control_max_bytes" in verdict.log  # what to do
    assert verdict.log.startswith("dev: ")
    # The same size is fine on a data-plane topic.
    assert gate.admit(ACT, Family.ACTIVATIONS, 101, 0.0).accepted
    assert gate.admit(ACT, Family.ACTIVATIONS, 1001, 0.0).reason == OVERSIZE
    assert gate.drops == {OVERSIZE: 2}
    assert gate.dropped == 2


def test_an_oversized_payload_takes_no_token() -> None:
    gate = InboxGate(InboxLimits(control_max_bytes=10, control_rate=1.0, control_burst=1.0))
    for _ in range(5):
        assert gate.admit(HB, Family.HEARTBEAT, 11, 0.0).reason == OVERSIZE
    assert gate.admit(HB, Family.HEARTBEAT, 10, 0.0).accepted


# =============================================================================================
# Rate


def test_burst_then_rate() -> None:
    gate = InboxGate(InboxLimits(control_rate=10.0, control_burst=5.0))
    t = 0.0
    assert all(gate.admit(HB, Family.HEARTBEAT, 1, t).accepted for _ in range(5))  # the burst
    verdict = gate.admit(HB, Family.HEARTBEAT, 1, t)
    assert verdict.reason == RATE
    assert verdict.log is not None and "10 messages/s" in verdict.log and "bursts of 5" in verdict.log
    assert "InboxLimits.control_rate" in verdict.log
    t += 0.05  # half a token
    assert gate.admit(HB, Family.HEARTBEAT, 1, t).reason == RATE
    t += 0.05  # the other half: one message
    assert gate.admit(HB, Family.HEARTBEAT, 1, t).accepted
    assert gate.admit(HB, Family.HEARTBEAT, 1, t).reason == RATE
    # A steady 10/s goes through indefinitely.
    for _ in range(50):
        t += 0.1
        assert gate.admit(HB, Family.HEARTBEAT, 1, t).accepted
    # A long pause refills the bucket to the burst, not beyond.
    t += 3600.0
    assert sum(gate.admit(HB, Family.HEARTBEAT, 1, t).accepted for _ in range(20)) == 5


def test_rates_are_per_topic() -> None:
    gate = InboxGate(InboxLimits(control_rate=1.0, control_burst=2.0))
    other = TOPICS.device(Family.HEARTBEAT, "w2")
    assert [gate.admit(HB, Family.HEARTBEAT, 1, 0.0).accepted for _ in range(3)] == [True, True, False]
    assert [gate.admit(other, Family.HEARTBEAT, 1, 0.0).accepted for _ in range(3)] == [True, True, False]


def test_default_rates_never_throttle_legitimate_traffic() -> None:
    """A heartbeat a second for an hour, and 4000 activations a second for ten seconds."""
    gate = InboxGate()
    assert all(gate.admit(HB, Family.HEARTBEAT, 200, float(s)).accepted for s in range(3600))
    assert all(gate.admit(ACT, Family.ACTIVATIONS, 10_000, i / 4000).accepted for i in range(40_000))
    assert gate.dropped == 0


# =============================================================================================
# Inbox room


def test_queue_cap_per_topic_and_release() -> None:
    gate = InboxGate(InboxLimits(max_queued_per_topic=3, max_queued=100))
    for _ in range(3):
        assert gate.admit(ACT, Family.ACTIVATIONS, 10, 0.0).accepted
        assert gate.enqueue(ACT, 10, 0.0).accepted
    assert gate.queued_on(ACT) == 3
    verdict = gate.admit(ACT, Family.ACTIVATIONS, 10, 0.0)  # checked before decoding
    assert verdict.reason == TOPIC_QUEUE
    assert verdict.log is not None and "max_queued_per_topic=3" in verdict.log
    assert gate.enqueue(ACT, 10, 0.0).reason == TOPIC_QUEUE  # and again, atomically, on enqueue
    # Another topic still has room.
    assert gate.enqueue(HB, 10, 0.0).accepted
    gate.release(ACT, 10)
    assert gate.queued_on(ACT) == 2
    assert gate.enqueue(ACT, 10, 0.0).accepted
    assert gate.queued == 4


def test_queue_cap_in_total_and_in_bytes() -> None:
    gate = InboxGate(InboxLimits(max_queued_per_topic=10, max_queued=5, max_queued_bytes=1000))
    topics = [TOPICS.device(Family.HEARTBEAT, f"w{i}") for i in range(6)]
    for topic in topics[:5]:
        assert gate.enqueue(topic, 1, 0.0).accepted
    verdict = gate.enqueue(topics[5], 1, 0.0)
    assert verdict.reason == QUEUE
    assert verdict.log is not None and "max_queued=5" in verdict.log
    for topic in topics[:5]:
        gate.release(topic, 1)
    assert gate.queued == 0 and gate.queued_bytes == 0
    assert gate.enqueue(ACT, 900, 0.0).accepted
    assert gate.enqueue(ACT, 101, 0.0).reason == QUEUE  # 1001 bytes would wait
    assert gate.enqueue(ACT, 100, 0.0).accepted
    assert gate.queued_bytes == 1000


def test_release_never_goes_negative() -> None:
    gate = InboxGate()
    gate.release(ACT, 10)
    gate.release("never/seen", 10)
    assert gate.queued == 0 and gate.queued_bytes == 0 and gate.queued_on(ACT) == 0


# =============================================================================================
# Tracked topics


def test_tracked_topics_are_bounded_least_recently_used_first() -> None:
    gate = InboxGate(InboxLimits(control_rate=1.0, control_burst=1.0, max_topics=3))
    a, b, c, d = (TOPICS.device(Family.HEARTBEAT, f"x{i}") for i in range(4))
    for topic in (a, b, c):
        assert gate.admit(topic, Family.HEARTBEAT, 1, 0.0).accepted
    assert gate.admit(a, Family.HEARTBEAT, 1, 0.0).reason == RATE  # a is used again: b is the oldest now
    assert gate.admit(d, Family.HEARTBEAT, 1, 0.0).accepted
    assert gate.tracked == 3
    # b was forgotten (a fresh bucket), a was not (still empty).
    assert gate.admit(b, Family.HEARTBEAT, 1, 0.0).accepted
    assert gate.admit(a, Family.HEARTBEAT, 1, 0.0).reason == RATE
    assert gate.tracked == 3


def test_invented_topics_do_not_grow_the_table() -> None:
    gate = InboxGate(InboxLimits(max_topics=100))
    for i in range(10_000):
        gate.admit(TOPICS.device(Family.REQUEST, f"d{i}"), Family.REQUEST, 10, i * 1e-3)
        gate.reject(f"{TOPICS.base}/nowhere/{i}", MALFORMED, "bad", i * 1e-3)
    assert gate.tracked == 100


def test_a_forgotten_topic_with_queued_messages_is_accounted_in_total() -> None:
    gate = InboxGate(InboxLimits(max_topics=2))
    assert gate.enqueue(ACT, 10, 0.0).accepted
    gate.admit(HB, Family.HEARTBEAT, 1, 0.0)
    gate.admit(TOPICS.device(Family.HEARTBEAT, "w9"), Family.HEARTBEAT, 1, 0.0)  # ACT forgotten
    assert gate.queued_on(ACT) == 0 and gate.queued == 1
    gate.release(ACT, 10)
    assert gate.queued == 0 and gate.queued_bytes == 0


# =============================================================================================
# Log lines


def test_a_flood_on_one_topic_logs_a_few_lines_then_a_summary_every_interval() -> None:
    gate = InboxGate(InboxLimits(control_max_bytes=10, log_first=1, log_interval=10.0), name="dev")
    lines = [gate.admit(HB, Family.HEARTBEAT, 50, 0.001 * i).log for i in range(1000)]  # 1 s of flood
    logged = [line for line in lines if line is not None]
    assert len(logged) == 1 and HB in logged[0] and "50-byte" in logged[0]
    # Nothing more until 10 s after the first line; then one summary with the count.
    assert gate.admit(HB, Family.HEARTBEAT, 50, 9.9).log is None
    summary = gate.admit(HB, Family.HEARTBEAT, 50, 10.0).log
    assert summary is not None
    assert "1001 more messages dropped" in summary and HB in summary and "oversize 1001" in summary
    assert gate.admit(HB, Family.HEARTBEAT, 50, 15.0).log is None
    assert gate.drops[OVERSIZE] == 1003


def test_flush_reports_drops_that_no_line_covered_yet() -> None:
    gate = InboxGate(InboxLimits(log_first=1, log_interval=10.0))
    assert gate.reject(HB, MALFORMED, "dropped garbage", 0.0).log == "dropped garbage"
    for i in range(7):
        assert gate.reject(HB, MALFORMED, f"dropped garbage {i}", 1.0 + i).log is None
    assert gate.flush(5.0) == []  # not due yet
    lines = gate.flush(10.0)
    assert len(lines) == 1
    assert "7 more messages dropped" in lines[0] and "malformed 7" in lines[0]
    assert "latest: dropped garbage 6" in lines[0]
    assert gate.flush(30.0) == []  # nothing new


def test_many_flooded_topics_share_one_log_budget() -> None:
    gate = InboxGate(InboxLimits(log_first=1, log_interval=10.0, log_budget=5))
    lines = [
        gate.reject(TOPICS.device(Family.REQUEST, f"d{i}"), MALFORMED, f"bad {i}", 0.0).log
        for i in range(1000)
    ]
    assert sum(line is not None for line in lines) == 5
    # The budget refills at log_budget lines per log_interval: one more line 2 s later.
    later = [
        gate.reject(TOPICS.device(Family.REQUEST, f"e{i}"), MALFORMED, "bad", 2.0).log for i in range(50)
    ]
    assert sum(line is not None for line in later) == 1
    # The budget also caps the summaries; a line that could not be written says what it missed.
    assert len(gate.flush(100.0)) == 5


def test_two_different_first_drops_on_one_topic_are_both_logged_by_default() -> None:
    gate = InboxGate()
    assert gate.reject(HB, MALFORMED, "undecodable", 0.0).log is not None
    assert gate.reject(HB, MALFORMED, "version 99", 0.0).log is not None


# =============================================================================================
# Senders


@pytest.mark.parametrize(
    ("family", "checked"),
    [
        (Family.STATUS, True),
        (Family.HEARTBEAT, True),
        (Family.METRICS, True),
        (Family.REPLY, True),
        (Family.REPLICA, True),
        (Family.PROBE, True),
        (Family.REQUEST, True),
        (Family.CONTROL, False),  # the central node's
        (Family.PROFILE, False),  # the central node's (or an operator's tool)
    ],
)
def test_sender_must_own_the_device_topic(family: Family, checked: bool) -> None:
    info = TopicInfo(family, device="w1")
    assert sender_problem(info, "w1") is None
    problem = sender_problem(info, "central")
    assert (problem is not None) == checked
    if problem is not None:
        assert "'central'" in problem and "'w1'" in problem
    assert sender_problem(TopicInfo(Family.ACTIVATIONS, stage=1), "anyone") is None
    assert sender_problem(TopicInfo(Family.COMMAND), "anyone") is None


# =============================================================================================
# Roles on the in-memory transport


class Recorder(Role):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.arrived: list[tuple[str, Message]] = []

    def on_arrival(self, sender: str, message: Message) -> None:
        self.arrived.append((sender, message))


@pytest.fixture
def broker() -> Iterator[MemoryBroker]:
    yield MemoryBroker()


def make_role(broker: MemoryBroker, limits: InboxLimits | None = None) -> tuple[Recorder, FakeClock]:
    role = Recorder(MemoryTransport(broker, "role"), TOPICS, "central", limits=limits)
    clock = FakeClock()
    role.clock = clock
    role.listen(TOPICS.all())
    return role, clock


def drain(role: Role) -> list[Inbound]:
    out = []
    while (item := role.next_message(0)) is not None:
        out.append(item)
    return out


def test_a_forged_sender_on_another_devices_topic_is_dropped(
    broker: MemoryBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="edgeagent.runtime.role")
    role, _ = make_role(broker)
    pub = MemoryTransport(broker, "pub")
    pub.publish(HB, encode(Heartbeat(device_id="w1", seq=1), sender="w2"))
    pub.publish(
        TOPICS.device(Family.STATUS, "w1"), encode(Status(device_id="w1", state="offline"), sender="x")
    )
    assert role.dropped == 2 and role.gate.drops == {SENDER: 2}
    assert role.arrived == []  # nothing reached the liveness stamp either
    assert drain(role) == []
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "sender 'w2' on device 'w1'" in text and HB in text
    # The device itself, and the central node on a device's control topic, are fine.
    good = Heartbeat(device_id="w1", seq=2)
    pub.publish(HB, encode(good, sender="w1"))
    control = TOPICS.device(Family.CONTROL, "w1")
    pub.publish(control, encode(Ping(run_id="r"), sender="central"))
    got = drain(role)
    assert [(i.sender, i.message) for i in got] == [
        ("w1", good),
        ("central", Ping(run_id="r")),
    ]
    assert [i.wire_topic for i in got] == [HB, control]
    assert role.dropped == 2


def test_role_drops_oversized_payloads_before_decoding(broker: MemoryBroker) -> None:
    role, _ = make_role(broker, InboxLimits(control_max_bytes=200))
    pub = MemoryTransport(broker, "pub")
    big = Status(device_id="w1", state="idle", detail="x" * 300)
    pub.publish(TOPICS.device(Family.STATUS, "w1"), encode(big, sender="w1"))
    assert role.dropped == 1 and role.gate.drops == {OVERSIZE: 1}
    assert role.arrived == [] and drain(role) == []


def test_role_rate_limits_a_topic_with_its_clock(broker: MemoryBroker) -> None:
    role, clock = make_role(broker, InboxLimits(control_rate=2.0, control_burst=3.0))
    pub = MemoryTransport(broker, "pub")
    for seq in range(10):
        pub.publish(HB, encode(Heartbeat(device_id="w1", seq=seq), sender="w1"))
    assert [i.message.seq for i in drain(role)] == [0, 1, 2]  # type: ignore[attr-defined]
    assert role.dropped == 7 and role.gate.drops == {RATE: 7}
    clock.advance(0.5)
    pub.publish(HB, encode(Heartbeat(device_id="w1", seq=10), sender="w1"))
    assert [i.message.seq for i in drain(role)] == [10]  # type: ignore[attr-defined]


def test_role_caps_its_inbox_and_next_message_gives_the_slot_back(broker: MemoryBroker) -> None:
    role, _ = make_role(broker, InboxLimits(max_queued_per_topic=2))
    pub = MemoryTransport(broker, "pub")
    for seq in range(3):
        pub.publish(HB, encode(Heartbeat(device_id="w1", seq=seq), sender="w1"))
    assert role.dropped == 1 and role.gate.drops == {TOPIC_QUEUE: 1}
    assert role.gate.queued_on(HB) == 2
    first = role.next_message(0)
    assert first is not None and first.message == Heartbeat(device_id="w1", seq=0)
    assert role.gate.queued_on(HB) == 1
    pub.publish(HB, encode(Heartbeat(device_id="w1", seq=3), sender="w1"))
    assert [i.message.seq for i in drain(role)] == [1, 3]  # type: ignore[attr-defined]
    assert role.gate.queued == 0 and role.gate.queued_bytes == 0


def test_role_flood_of_garbage_logs_a_bounded_number_of_lines(
    broker: MemoryBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="edgeagent.runtime.role")
    role, clock = make_role(broker, InboxLimits(data_rate=1e9, data_burst=1e9))
    pub = MemoryTransport(broker, "pub")
    for i in range(2000):
        pub.publish(TOPICS.gradients(1, "w1"), b"\xff garbage %d" % i)
    assert role.dropped == 2000
    assert len(caplog.records) == 3  # the first few, then summaries only
    clock.advance(10.0)
    assert role.next_message(0) is None
    assert len(caplog.records) == 4
    assert "1997 more messages dropped" in caplog.records[-1].getMessage()


def test_probes_pass_the_same_gate(broker: MemoryBroker) -> None:
    role = Role(MemoryTransport(broker, "w2"), TOPICS, "w2")
    probes = LinkProbes(role)
    probes.watch("w1")
    echoes: list[bytes] = []
    watcher = MemoryTransport(broker, "watcher")
    watcher.subscribe(TOPICS.device(Family.PROBE, "w2"), lambda t, p: echoes.append(p))
    pub = MemoryTransport(broker, "pub")
    probe = Probe(source="w1", target="w2", nonce=7)
    pub.publish(TOPICS.device(Family.PROBE, "w1"), encode(probe, sender="mallory"))
    assert echoes == [] and role.dropped == 1 and role.gate.drops == {SENDER: 1}
    pub.publish(TOPICS.device(Family.PROBE, "w1"), encode(probe, sender="w1"))
    assert len(echoes) == 1 and role.dropped == 1


# =============================================================================================
# Batches that fit a stage


def test_activation_problem() -> None:
    sample = ((128,), torch.float32)
    x, y = torch.zeros(4, 128), torch.tensor([0, 1, 2, 9])
    assert activation_problem(x, y, sample=sample, num_classes=10) is None
    assert "expected (B, 128) float32" in str(
        activation_problem(torch.zeros(4, 7), y, sample=sample, num_classes=10)
    )
    assert "float64" in str(activation_problem(x.double(), y, sample=sample, num_classes=10))
    assert "no batch" in str(activation_problem(torch.zeros(0, 128), y[:0], sample=sample, num_classes=10))
    assert "int64" in str(activation_problem(x, y.int(), sample=sample, num_classes=10))
    assert "int64" in str(activation_problem(x, y[:3], sample=sample, num_classes=10))
    assert "not all in [0, 10)" in str(
        activation_problem(x, torch.tensor([0, 1, 2, 10]), sample=sample, num_classes=10)
    )
    assert "not all in" in str(
        activation_problem(x, torch.tensor([0, -1, 2, 3]), sample=sample, num_classes=10)
    )
    # Without a known sample shape: the batch and the labels are still checked.
    assert activation_problem(torch.zeros(4, 3, 3), y, sample=None, num_classes=10) is None
    assert "floating point" in str(activation_problem(x.long(), y, sample=None, num_classes=10))


def test_gradient_problem() -> None:
    meta = ((4, 64), torch.float32)
    assert gradient_problem(torch.zeros(4, 64), meta) is None
    assert "no such batch" in str(gradient_problem(torch.zeros(4, 64), None))
    assert "expected (4, 64) float32" in str(gradient_problem(torch.zeros(4, 65), meta))
    assert "float16" in str(gradient_problem(torch.zeros(4, 64, dtype=torch.float16), meta))


@pytest.mark.parametrize(("name", "in_shape"), [("mlp", (64,)), ("cnn", (1, 8, 8))])
def test_stage_input_is_the_previous_layers_output(name: str, in_shape: tuple[int, ...]) -> None:
    """What the central node's layer profile puts in Assign tells each stage what it takes."""
    spec = ModelSpec(name, in_shape, 10)
    shapes = layer_output_shapes(spec)
    profile = profile_layers(build_layers(spec, 0, len(shapes), seed=0), torch.zeros(4, *in_shape), runs=1)
    got = [list(s) for s in profile.output_shapes]
    assert stage_input(spec, 0, got, list(profile.output_dtypes)) == (in_shape, torch.float32)
    for start in range(1, len(shapes)):
        expected = (shapes[start - 1][1:], torch.float32)
        assert stage_input(spec, start, got, list(profile.output_dtypes)) == expected
    assert stage_input(spec, 1, [], []) is None  # an assignment without a profile: unchecked
    assert stage_input(spec, 1, got, ["no-such-dtype"] * len(got)) is None


# =============================================================================================
# A worker with the real run's id and plan, but batches that do not fit


SPEC = ModelSpec("mlp", (64,), 10, (("hidden", (128, 64)),))  # layers: 64 -> 128 -> 64 -> 10


class StageOne:
    """Worker ``w1`` holding layer 1 (128 -> 64) of three stages, driven step by step."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.worker = Worker(
            WorkerConfig(cluster="lim", device_id="w1"), transport=MemoryTransport(broker, "w1"), modes=mode
        )
        self.worker.clock = FakeClock()
        self.worker.listen(TOPICS.device(Family.CONTROL, "w1"))
        self.pub = MemoryTransport(broker, "central")
        self.sent: list[tuple[str, bytes]] = []
        MemoryTransport(broker, "spy").subscribe(TOPICS.all(), lambda t, p: self.sent.append((t, p)))
        assign = make_assign(
            worker_list=["central", "w1", "w2"],
            points=[0, 1, 2, 3],
            model=SPEC.to_dict(),
            batches_per_epoch=10,
            in_flight=2,
            layer_shapes=[[128], [64], [10]],
            layer_dtypes=["float32"] * 3,
        )
        self.pub.publish(TOPICS.device(Family.CONTROL, "w1"), encode(assign, sender="central"))
        self.worker._step()
        assert self.run is not None and self.run.index == 1

    @property
    def run(self) -> Run | None:
        """The worker's pipeline run (its session's state), if it is in one."""
        session = self.worker.session
        return session.run if isinstance(session, PipelineSession) else None

    def send(self, topic: str, msg: Message, sender: str = "central") -> None:
        self.pub.publish(topic, encode(msg, sender=sender))
        for _ in range(10):  # handle it, and compute what it made ready (never block on an empty inbox)
            session = self.worker.session
            work = session is not None and session.has_work()
            if not work and self.worker.inbox.empty():
                return
            self.worker._step()

    def activation(
        self, batch: int, x: torch.Tensor, y: torch.Tensor | None = None, mode: ActivationMode = "train"
    ) -> None:
        y = torch.zeros(x.shape[0] if x.dim() else 1, dtype=torch.int64) if y is None else y
        msg = Activation(run_id="run", plan_id=0, stage=0, batch_id=batch, version=0, mode=mode, x=x, y=y)
        self.send(TOPICS.activations(0, "central"), msg)

    def gradient(self, batch: int, g: torch.Tensor) -> None:
        msg = Gradient(run_id="run", plan_id=0, stage=2, batch_id=batch, g=g, loss=1.0)
        self.send(TOPICS.gradients(2, "w2"), msg, sender="w2")

    def outputs(self, topic: str) -> int:
        return sum(t == topic for t, _ in self.sent)


def test_worker_drops_activations_that_do_not_fit_and_trains_on_the_real_one(broker: MemoryBroker) -> None:
    w = StageOne(broker)
    run = w.run
    assert run is not None and run.sample == ((128,), torch.float32)
    w.activation(0, torch.zeros(4, 7))  # wrong shape: the forward pass would raise
    w.activation(0, torch.zeros(4, 128, dtype=torch.float64))  # wrong dtype
    w.activation(0, torch.zeros(4, 128), torch.tensor([0, 1, 2, 99]))  # labels outside the classes
    w.activation(0, torch.zeros(4, 7), mode="eval")  # the evaluation pass would raise
    w.activation(0, torch.zeros(4, 128), mode="sideways")  # type: ignore[arg-type]  # the decoder drops it
    w.activation(10**9, torch.zeros(4, 128))  # far beyond anything in flight: would be kept forever
    assert w.worker.dropped == 6
    assert run.forwards == {} and run.evals == [] and run.next_forward == 0
    assert w.outputs(TOPICS.activations(1, "w1")) == 0
    w.activation(0, torch.randn(4, 128))  # the real batch 0
    assert run.next_forward == 1 and w.outputs(TOPICS.activations(1, "w1")) == 1
    assert w.worker.dropped == 6


def test_worker_drops_gradients_that_do_not_fit_and_keeps_the_batch(broker: MemoryBroker) -> None:
    w = StageOne(broker)
    run = w.run
    assert run is not None
    w.activation(0, torch.randn(4, 128))
    assert run.runner.outputs == {0: ((4, 64), torch.float32)}
    w.gradient(0, torch.zeros(4, 65))  # wrong shape: backward would raise after taking the batch
    w.gradient(0, torch.zeros(4, 64, dtype=torch.float64))  # wrong dtype
    w.gradient(5, torch.zeros(4, 64))  # a batch that is not in flight here
    assert w.worker.dropped == 3
    assert run.backwards == {} and run.next_backward == 0 and run.stage.in_flight == [0]
    w.gradient(0, torch.randn(4, 64))  # the real one
    assert run.next_backward == 1 and run.stage.in_flight == [] and run.runner.outputs == {}
    assert w.outputs(TOPICS.gradients(1, "w1")) == 1


# =============================================================================================
# The central node: gradients and evaluation results of its own run


def test_central_takes_only_gradients_and_results_it_waits_for(broker: MemoryBroker) -> None:
    config = CentralConfig(cluster="lim", progress=False, workers=2)
    central = Central(config, transport=MemoryTransport(broker, "c"), modes=mode)
    data = load_dataset("synthetic:200:64:10", seed=0, test_fraction=0.2)
    assert data.in_shape == SPEC.in_shape
    run = PipelineRun(central, config, data, SPEC, ["c", "w1", "w2"])  # stage 0: layer 0, 64 -> 128
    assert run.state.points == [0, 1, 2, 3]
    for kind, handler in run.handlers().items():
        central.on(kind, handler)
    info = TopicInfo(Family.GRADIENTS, device="w1", stage=1)

    def grad(batch: int, g: torch.Tensor) -> Inbound:
        msg = Gradient(
            run_id=central.run_id, plan_id=run.state.plan_id, stage=1, batch_id=batch, g=g, loss=1.0
        )
        return Inbound(info, "w1", msg, wire_topic=TOPICS.gradients(1, "w1"))

    run.state.runner.outputs[3] = ((4, 128), torch.float32)
    central.dispatch(grad(3, torch.zeros(4, 7)))
    central.dispatch(grad(3, torch.zeros(4, 128, dtype=torch.float16)))
    central.dispatch(grad(4, torch.zeros(4, 128)))
    assert run.state.inbox.gradients == {} and central.dropped == 3
    central.dispatch(grad(3, torch.zeros(4, 128)))
    assert list(run.state.inbox.gradients) == [3]

    def result(batch: int) -> Inbound:
        msg = EvalResult(
            run_id=central.run_id, plan_id=run.state.plan_id, batch_id=batch, correct=1, count=1, loss_sum=0.0
        )
        info = TopicInfo(Family.RESULTS, device="w2", stage=2)
        return Inbound(info, "w2", msg, wire_topic=TOPICS.results(2, "w2"))

    run.state.inbox.eval_ids = {0, 1}
    central.dispatch(result(7))
    assert run.state.inbox.results == {} and central.dropped == 4
    central.dispatch(result(1))
    assert list(run.state.inbox.results) == [1]
    run.state.inbox.eval_ids = set()
    central.dispatch(result(0))  # no evaluation out: a late duplicate, ignored quietly
    assert list(run.state.inbox.results) == [1] and central.dropped == 4


def test_worker_leaves_a_run_when_the_central_node_goes_idle_without_its_stop(broker: MemoryBroker) -> None:
    """A lost ``stop`` must not leave a worker in a finished run for ever (busy, so never picked again);
    the central node's retained ``idle`` status ends it. A crash (``offline``) does not: it may resume."""
    w = StageOne(broker)
    central_status = TOPICS.device(Family.STATUS, "central")
    w.send(central_status, Status(device_id="central", state="offline"))
    w.send(central_status, Status(device_id="central", state="training", run_id="run", stage=0))
    assert w.run is not None
    w.send(central_status, Status(device_id="central", state="idle"))
    assert w.worker.session is None and w.worker.completed_runs == 1
