"""The role runtime's handling: one handler per message type, ``dispatch``, ``pump`` and ``wait_until``
(in-process transport: pure logic, no broker)."""

from __future__ import annotations

import pytest

from edgeagent.errors import TrainingError
from edgeagent.protocol.commands import Collect, Command, Ping, Stop
from edgeagent.protocol.messages import Heartbeat, Message, Status
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import encode
from edgeagent.runtime.role import Inbound, Role
from edgeagent.transport.memory import MemoryBroker, MemoryTransport

TOPICS = Topics("rt")


def make_role(broker: MemoryBroker, name: str = "me") -> Role:
    role = Role(MemoryTransport(broker, name), TOPICS, name)
    role.listen(TOPICS.fixed(Family.COMMAND))
    role.listen(TOPICS.devices(Family.STATUS))
    return role


def publish(broker: MemoryBroker, topic: str, msg: Message, sender: str = "central") -> None:
    MemoryTransport(broker, f"pub-{sender}").publish(topic, encode(msg, sender=sender))


def test_dispatch_by_type_and_by_base_type() -> None:
    broker = MemoryBroker()
    role = make_role(broker)
    seen: list[str] = []
    role.on(Command, lambda item: seen.append(f"command:{type(item.message).__name__}"))
    role.on(Stop, lambda item: seen.append("stop"))
    for msg in (Ping(run_id="r"), Stop(run_id="r"), Collect(run_id="r")):
        publish(broker, TOPICS.fixed(Family.COMMAND), msg)
    assert role.pump(0)
    # The most specific handler wins; the other commands reach the base's.
    assert seen == ["command:Ping", "stop", "command:Collect"]
    assert not role.pump(0)  # nothing left


def test_messages_without_a_handler_are_ignored_and_a_handler_can_be_replaced() -> None:
    broker = MemoryBroker()
    role = make_role(broker)
    got: list[str] = []
    publish(broker, TOPICS.device(Family.STATUS, "w1"), Status(device_id="w1", state="idle"), sender="w1")
    role.pump(0)  # no handler for Status: ignored, not an error
    role.on(Status, lambda item: got.append("first"))
    role.on(Status, lambda item: got.append("second"))
    publish(broker, TOPICS.device(Family.STATUS, "w1"), Status(device_id="w1", state="idle"), sender="w1")
    role.pump(0)
    assert got == ["second"]


def test_wait_until_returns_when_done_and_handles_what_arrives_meanwhile() -> None:
    broker = MemoryBroker()
    role = make_role(broker)
    stops: list[Inbound] = []
    role.on(Stop, stops.append)
    publish(broker, TOPICS.fixed(Family.COMMAND), Stop(run_id="r"))
    assert role.wait_until(lambda: bool(stops), 5.0, "the stop") is None
    assert len(stops) == 1


def test_wait_until_returns_the_fault_it_finds() -> None:
    broker = MemoryBroker()
    role = make_role(broker)
    calls = iter([None, None, "worker w1 stopped"])
    fault = role.wait_until(lambda: False, 5.0, "never", fault=lambda: next(calls), poll=0.01)
    assert fault == "worker w1 stopped"


def test_wait_until_says_what_did_not_happen_and_how_long_it_waited() -> None:
    broker = MemoryBroker()
    role = make_role(broker)
    pending = {"w1", "w2"}
    with pytest.raises(TrainingError, match=r"workers \['w1', 'w2'\] did not report 'built' \(waited 0 s\)"):
        role.wait_until(
            lambda: False, 0.05, lambda: f"workers {sorted(pending)} did not report 'built'", poll=0.01
        )
    with pytest.raises(TrainingError, match=r"the weights \(waited 0 s\)"):
        role.wait_until(lambda: False, 0.01, "the weights", poll=0.01)


def test_a_handler_sees_messages_in_arrival_order() -> None:
    broker = MemoryBroker()
    role = make_role(broker)
    role.listen(TOPICS.devices(Family.HEARTBEAT))
    seqs: list[int] = []
    role.on(
        Heartbeat, lambda item: seqs.append(item.message.seq) if isinstance(item.message, Heartbeat) else None
    )
    for seq in range(5):
        publish(
            broker, TOPICS.device(Family.HEARTBEAT, "w1"), Heartbeat(device_id="w1", seq=seq), sender="w1"
        )
    role.wait_until(lambda: len(seqs) == 5, 5.0, "five heartbeats")
    assert seqs == [0, 1, 2, 3, 4]
