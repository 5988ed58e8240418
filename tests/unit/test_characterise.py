"""A device's ``h`` (papers/004 Sec. 3.2) on the wire and on the worker: ``Discover`` names the model, the
worker measures (once per model, batch size and slowdown) and announces it; ``characterise`` measures
again. In-memory broker."""

from __future__ import annotations

import functools
import json
import logging
import math
import re
from typing import Any

import pytest
import torch

from edgeagent.config import CHARACTERISE_ROUNDS, WorkerConfig, build
from edgeagent.errors import ConfigError, ProtocolError
from edgeagent.models import ModelSpec
from edgeagent.modes import mode
from edgeagent.predictor.measure import (
    ModelLayers,
    characterise,
    characterise_bound,
    characterise_ranges,
    model_key,
)
from edgeagent.predictor.submodels import REPRESENTATIVES
from edgeagent.protocol.commands import COMMAND_TYPES, Characterise
from edgeagent.protocol.limits import MALFORMED
from edgeagent.protocol.messages import MAX_H, Announce, Discover, ErrorReport, Message
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode, encode
from edgeagent.roles.worker import Worker
from edgeagent.runtime.role import Role
from edgeagent.transport.memory import MemoryBroker, MemoryTransport
from tests.helpers import make_assign

TOPICS = Topics("h")
SPEC = ModelSpec("mlp", (16,), 4)
MODEL = SPEC.to_dict()
H = [0.001 * (k + 1) for k in range(10)]

# ---------------------------------------------------------------------------------------------
# The wire


def test_the_new_fields_and_characterise_round_trip() -> None:
    messages: list[Message] = [
        Discover(run_id="r", model=MODEL, batch_size=32),
        Announce(device_id="w1", h=H, h_key=model_key(SPEC), h_batch=32, h_seconds=0.5),
        Announce(device_id="w1", h=H[:3], h_key="k", h_batch=1, h_seconds=60.2),  # the budget ran out
        Announce(device_id="w1", h=H, h_key="k", h_batch=8, h_seconds=0.7, tiles=[0.002] * 8),
        Characterise(run_id="r", device="w1", model=MODEL, batch_size=8),
    ]
    for msg in messages:
        assert decode(encode(msg, sender="x")) == ("x", msg)
    assert COMMAND_TYPES["characterise"] is Characterise
    assert MAX_H == REPRESENTATIVES
    wire = json.loads(encode(messages[-1], sender="central"))
    assert wire["b"] == {
        "run_id": "r",
        "name": "characterise",
        "args": {"device": "w1", "model": MODEL, "batch_size": 8},
    }


def _raw(kind: str, body: dict[str, Any], sender: str = "x") -> bytes:
    return json.dumps({"v": 1, "k": kind, "s": sender, "b": body}).encode()  # allow_nan, as a sloppy peer


def test_older_messages_decode_with_the_defaults() -> None:
    assert decode(_raw("discover", {"run_id": "r"}))[1] == Discover(run_id="r", model={}, batch_size=0)
    _, announce = decode(_raw("announce", {"device_id": "w1", "threads": 2}))
    assert isinstance(announce, Announce)
    assert (announce.h, announce.h_key, announce.h_batch, announce.h_seconds) == ([], "", 0, 0.0)
    assert announce.tiles == []


ANNOUNCED = {"device_id": "w1", "h": H, "h_key": "k", "h_batch": 8, "h_seconds": 1.0}
BAD = [
    # (id, kind, body, regex the error must match)
    ("h-nan", "announce", {**ANNOUNCED, "h": [0.1, math.nan]}, r"announce\.h\[1\]: expected a finite number"),
    ("h-inf", "announce", {**ANNOUNCED, "h": [math.inf]}, r"announce\.h\[0\]: expected a finite number"),
    ("h-negative", "announce", {**ANNOUNCED, "h": [0.1, -0.2]}, r"'w1': h must hold finite seconds >= 0"),
    ("h-11", "announce", {**ANNOUNCED, "h": [0.1] * 11}, r"'w1': h has 11 entries, at most 10"),
    ("h-str", "announce", {**ANNOUNCED, "h": "fast"}, r"announce\.h: expected a list, got str"),
    ("h-item-str", "announce", {**ANNOUNCED, "h": [0.1, "2"]}, r"announce\.h\[1\]: expected a number"),
    ("h-item-bool", "announce", {**ANNOUNCED, "h": [True]}, r"announce\.h\[0\]: expected a number"),
    ("h-map", "announce", {**ANNOUNCED, "h": {"a": 1.0}}, r"announce\.h: expected a list, got dict"),
    (
        "h-seconds",
        "announce",
        {**ANNOUNCED, "h_seconds": -1.0},
        r"h_seconds -1\.0 .* must be finite and >= 0",
    ),
    ("h-batch", "announce", {**ANNOUNCED, "h_batch": -2}, r"h_batch -2 must be finite and >= 0"),
    ("tiles-negative", "announce", {**ANNOUNCED, "tiles": [0.1, -0.2]}, r"'w1': tiles must hold finite"),
    ("tiles-65", "announce", {**ANNOUNCED, "tiles": [0.1] * 65}, r"'w1': tiles has 65 entries, at most 64"),
    ("tiles-str", "announce", {**ANNOUNCED, "tiles": "8"}, r"announce\.tiles: expected a list, got str"),
    ("h-no-key", "announce", {**ANNOUNCED, "h_key": ""}, r"h without the model \(h_key\) and batch size"),
    ("h-key-int", "announce", {**ANNOUNCED, "h_key": 5}, r"announce\.h_key: expected str"),
    (
        "discover-batch",
        "discover",
        {"run_id": "r", "model": MODEL},
        r"discover: a model needs a batch size >= 1",
    ),
    ("discover-no-model", "discover", {"run_id": "r", "batch_size": 4}, r"batch size 4 without a model"),
    ("discover-model", "discover", {"run_id": "r", "model": "mlp", "batch_size": 4}, r"discover\.model"),
]


@pytest.mark.parametrize(("kind", "body", "pattern"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_malformed_h_and_model_requests_are_rejected_on_decode(
    kind: str, body: dict[str, Any], pattern: str
) -> None:
    with pytest.raises(ProtocolError, match=pattern):
        decode(_raw(kind, body))


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        ({"device": "w1", "model": MODEL}, r"lacks field 'batch_size'"),
        ({"device": "w1", "model": MODEL, "batch_size": 0}, r"characterise 'w1': a model needs a batch"),
        ({"device": "w1", "model": {}, "batch_size": 8}, r"characterise 'w1': names no model"),
        ({"device": "w1", "model": MODEL, "batch_size": "8"}, r"command\.batch_size: expected int"),
    ],
)
def test_malformed_characterise_is_rejected(args: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ProtocolError, match=pattern):
        decode(_raw("command", {"run_id": "r", "name": "characterise", "args": args}))


def test_a_role_drops_a_bad_announce_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    broker = MemoryBroker()
    role = Role(MemoryTransport(broker, "central"), TOPICS, "central")
    role.listen(TOPICS.devices(Family.ANNOUNCE))
    seen: list[Message] = []
    role.on(Announce, lambda item: seen.append(item.message))
    publisher = MemoryTransport(broker, "w1")
    topic = TOPICS.device(Family.ANNOUNCE, "w1")
    with caplog.at_level(logging.WARNING):
        publisher.publish(topic, _raw("announce", {**ANNOUNCED, "h": [-1.0]}, sender="w1"))
        publisher.publish(topic, _raw("announce", ANNOUNCED, sender="w1"))
        role.pump(0)
    assert [m.h for m in seen if isinstance(m, Announce)] == [H]  # the good one only
    assert role.gate.drops[MALFORMED] == 1
    assert "h must hold finite seconds >= 0, got -1.0" in caplog.text


# ---------------------------------------------------------------------------------------------
# The worker


@pytest.fixture(autouse=True)
def short_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measurement windows of 20 ms instead of 200 (what is tested here is what the worker does with
    h, not how well it is measured: tests/unit/test_predictor.py): 0.4 s per h instead of 3.6."""
    import edgeagent.roles.worker.characterise as worker_characterise

    monkeypatch.setattr(
        worker_characterise, "characterise", functools.partial(characterise, min_seconds=0.02)
    )


class Device:
    """Worker ``w1`` on an in-memory broker, with its announcements and replies recorded."""

    def __init__(self, **config: Any) -> None:
        broker = MemoryBroker()
        self.worker = Worker(
            WorkerConfig(cluster="h", device_id="w1", characterise_budget=30.0, **config),
            transport=MemoryTransport(broker, "w1"),
            modes=mode,
        )
        for topic in (
            TOPICS.fixed(Family.DISCOVER),
            TOPICS.fixed(Family.COMMAND),
            TOPICS.device(Family.CONTROL, "w1"),
        ):
            self.worker.listen(topic)
        self.pub = MemoryTransport(broker, "central")
        self.sent: list[Message] = []
        spy = MemoryTransport(broker, "spy")
        for topic in (TOPICS.device(Family.ANNOUNCE, "w1"), TOPICS.device(Family.REPLY, "w1")):
            spy.subscribe(topic, lambda _t, p: self.sent.append(decode(p)[1]))

    def send(self, msg: Message, topic: str | None = None) -> None:
        """Deliver ``msg`` (synchronously, in memory) and let the worker handle it."""
        if topic is None:
            topic = TOPICS.fixed(Family.COMMAND if isinstance(msg, Characterise) else Family.DISCOVER)
        self.pub.publish(topic, encode(msg, sender="central"))
        self.worker._step()

    def announced(self, msg: Message) -> Announce:
        """Send ``msg``; the one announcement it is answered with."""
        before = len(self.sent)
        self.send(msg)
        [answer] = [m for m in self.sent[before:] if isinstance(m, Announce)]
        assert isinstance(answer, Announce)
        return answer

    def errors(self) -> list[ErrorReport]:
        return [m for m in self.sent if isinstance(m, ErrorReport)]


def test_worker_measures_h_once_per_model_and_again_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    device = Device(threads=1)
    threads = torch.get_num_threads()
    with caplog.at_level(logging.INFO, logger="edgeagent.roles.worker.characterise"):
        first = device.announced(Discover(run_id="r", model=MODEL, batch_size=8))
    assert len(first.h) == 10 and all(x > 0 for x in first.h)
    assert len(first.tiles) == 6 and all(x > 0 for x in first.tiles)  # the 6-layer MLP: 6 tiles of one
    assert (first.h_key, first.h_batch, first.busy_with) == (model_key(SPEC), 8, "")
    assert 0 < first.h_seconds < 30
    line = re.compile(
        r"w1: measured h for mlp at batch 8 in \d+\.\d\d s \(10 sub-models, [\d.]+-[\d.]+ ms; 6 tiles\)"
    )
    assert [r.getMessage() for r in caplog.records if line.fullmatch(r.getMessage())], caplog.text
    assert torch.get_num_threads() == threads  # measured with the worker's threads, then restored

    again = device.announced(Discover(run_id="r2", model=MODEL, batch_size=8))
    assert (again.h, again.h_seconds) == (first.h, first.h_seconds)  # from the cache
    plain = device.announced(Discover(run_id="r3"))
    assert (plain.h, plain.h_key, plain.h_seconds) == (first.h, first.h_key, first.h_seconds)  # the last one
    other_batch = device.announced(Discover(run_id="r", model=MODEL, batch_size=4))
    assert other_batch.h_batch == 4 and other_batch.h_seconds != first.h_seconds

    remeasured = device.announced(Characterise(run_id="r", device="w1", model=MODEL, batch_size=8))
    assert len(remeasured.h) == 10 and remeasured.h_key == first.h_key and remeasured.h_batch == 8
    assert remeasured.h_seconds != first.h_seconds  # measured again, not the cache
    latest = device.announced(Discover(run_id="r", model=MODEL, batch_size=8))
    assert latest.h_seconds == remeasured.h_seconds  # the new one is cached

    before = len(device.sent)
    device.send(Characterise(run_id="r", device="w2", model=MODEL, batch_size=8))  # not this device
    assert len(device.sent) == before


def test_a_slowdown_change_needs_a_new_h() -> None:
    device = Device()
    first = device.announced(Discover(run_id="r", model=MODEL, batch_size=8))
    device.worker.slowdown = 3.0  # as `emulate` or a profile sets it
    plain = device.announced(Discover(run_id="r"))
    assert plain.slowdown == 3.0 and plain.h == [] and plain.h_key == ""  # measured at another slowdown
    slower = device.announced(Discover(run_id="r", model=MODEL, batch_size=8))
    assert slower.h_seconds != first.h_seconds and slower.slowdown == 3.0
    assert set(device.worker.characteriser.cache) == {(model_key(SPEC), 8, 1.0), (model_key(SPEC), 8, 3.0)}


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ({"name": "nonexistent", "in_shape": [16], "num_classes": 4}, r"unknown model 'nonexistent'"),
        ({"name": "mlp", "in_shape": [16], "num_classes": 4, "options": {"colour": 1}}, r"colour"),
        ({"name": "mlp"}, r"missing key"),
    ],
)
def test_a_model_that_does_not_build_is_announced_without_h(
    model: dict[str, Any], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    device = Device()
    measured = device.announced(Discover(run_id="r", model=MODEL, batch_size=8))
    with caplog.at_level(logging.ERROR):
        answer = device.announced(Discover(run_id="r", model=model, batch_size=8))
    assert (answer.h, answer.h_key, answer.h_batch) == ([], "", 0)  # not the other model's h
    assert re.search(rf"w1: cannot measure h for model '{model['name']}' at batch 8: .*{reason}", caplog.text)
    assert device.worker.session is None and not device.errors()  # discovery: logged, not reported
    answer = device.announced(Characterise(run_id="r", device="w1", model=model, batch_size=8))
    assert answer.h == []
    [report] = device.errors()
    assert report.code == "command" and re.search(reason, report.reason) and report.run_id == "r"
    assert device.announced(Discover(run_id="r")).h == measured.h  # the device goes on


def test_characterise_during_a_run_belongs_to_that_run() -> None:
    device = Device()
    spec = ModelSpec("mlp", (64,), 10, (("hidden", (128, 64)),))
    assign = make_assign(points=[0, 2, 3], model=spec.to_dict(), batches_per_epoch=10)
    device.send(assign, TOPICS.device(Family.CONTROL, "w1"))
    assert device.worker.session is not None
    answer = device.announced(Characterise(run_id="run", device="w1", model=MODEL, batch_size=8))
    assert answer.busy_with == "run" and len(answer.h) == 10  # the node's own command: the run waits
    before = len(device.sent)
    device.send(Characterise(run_id="other", device="w1", model=MODEL, batch_size=8))
    [report] = device.sent[before:]
    assert isinstance(report, ErrorReport) and report.code == "busy" and report.run_id == "other"
    # Another run's discovery does not make a busy device measure: it says what it knows.
    known = device.announced(Discover(run_id="other", model=MODEL, batch_size=8))
    assert known.busy_with == "run" and known.h_seconds == answer.h_seconds
    unknown = device.announced(Discover(run_id="other", model=MODEL, batch_size=2))
    assert unknown.h == []
    assert device.worker.session is not None  # still in its run


def test_the_budget_is_validated() -> None:
    with pytest.raises(ValueError, match="characterise_budget"):
        WorkerConfig(characterise_budget=0)
    with pytest.raises(ValueError, match="characterise_budget"):
        WorkerConfig(characterise_budget=math.inf)
    assert WorkerConfig().characterise_budget == 60.0
    with pytest.raises(ConfigError, match=r"characterise_budget: .*greater than 0"):
        build(WorkerConfig, {"characterise_budget": -1})


def test_the_worker_measures_h_with_its_configured_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    import edgeagent.roles.worker.characterise as worker_characterise

    rounds: list[int] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        rounds.append(kwargs["rounds"])
        return characterise(*args, **{**kwargs, "min_seconds": 0.02})

    monkeypatch.setattr(worker_characterise, "characterise", spy)
    assert len(Device(threads=1).announced(Discover(run_id="r", model=MODEL, batch_size=8)).h) == 10
    Device(threads=1, characterise_rounds=3).announced(Discover(run_id="r", model=MODEL, batch_size=8))
    assert rounds == [CHARACTERISE_ROUNDS, 3] and CHARACTERISE_ROUNDS == 2
    with pytest.raises(ConfigError, match=r"characterise_rounds: .*greater than or equal to 1"):
        build(WorkerConfig, {"characterise_rounds": 0})


def test_the_bound_of_characterising_counts_every_window() -> None:
    """The central node's wait for h comes from one step (Roster.h_wait): rounds x sub-models, each a
    warm-up, at least reps runs and the window's floor, and the run that crosses it."""
    assert characterise_bound(0.01, 18, reps=3, rounds=2, min_seconds=0.2) == pytest.approx(2 * 18 * 0.22)
    assert characterise_bound(0.5, 18, reps=3, rounds=2, min_seconds=0.2) == pytest.approx(2 * 18 * 2.5)
    with pytest.raises(ValueError, match="rounds 0"):
        characterise_bound(0.5, 18, rounds=0)
    # What it counts is what characterise measures: the ten representatives and the tiling.
    layers = ModelLayers.build(ModelSpec.from_dict(MODEL), 8)
    chosen, tiled = characterise_ranges(layers)
    measured = characterise(layers, min_seconds=0.0, reps=1)
    assert (len(chosen), len(tiled)) == (len(measured.h), len(measured.tiles))
    assert len(chosen) == REPRESENTATIVES and tiled


@pytest.mark.parametrize(("recovery_logs", "kept"), [(True, True), (False, False)])
def test_a_worker_logs_what_it_sends_only_for_a_recovery_without_rollback(
    recovery_logs: bool, kept: bool
) -> None:
    """--recovery-mode rollback replays from the replicas: the Assign tells workers to keep no logs."""
    device = Device()
    spec = ModelSpec("mlp", (64,), 10, (("hidden", (128, 64)),))
    assign = make_assign(
        points=[0, 2, 3], model=spec.to_dict(), batches_per_epoch=10, recovery_logs=recovery_logs
    )
    device.send(assign, TOPICS.device(Family.CONTROL, "w1"))
    from edgeagent.modes.pipeline.worker.session import PipelineSession

    session = device.worker.session
    assert isinstance(session, PipelineSession)
    assert (session.run.runner.log_keep > 0) is kept
