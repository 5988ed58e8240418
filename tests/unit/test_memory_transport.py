"""The in-memory transport (``transport/memory.py``): chunked payloads whole, retained messages."""

from __future__ import annotations

import random

from edgeagent.transport.memory import MemoryBroker, MemoryTransport


def test_memory_transport_delivers_chunked_payload_whole() -> None:
    broker = MemoryBroker()
    frames_seen: list[int] = []
    route = broker.route

    def spy(topic: str, payload: bytes, retain: bool) -> None:
        frames_seen.append(len(payload))
        route(topic, payload, retain)

    broker.route = spy  # type: ignore[method-assign]
    sender = MemoryTransport(broker, "a", chunk_size=1024)
    receiver = MemoryTransport(broker, "b")
    got: list[tuple[str, bytes]] = []
    receiver.subscribe("data/#", lambda t, p: got.append((t, p)))
    try:
        payload = random.Random(4).randbytes(10_000)
        sender.publish("data/x", payload)
        assert len(frames_seen) > 1 and max(frames_seen) <= 1024
        assert got == [("data/x", payload)]
        sender.publish("other/x", payload)
        assert len(got) == 1
    finally:
        sender.close()
        receiver.close()


def test_memory_transport_retained_for_late_subscribers() -> None:
    broker = MemoryBroker()
    pub = MemoryTransport(broker, "pub")
    try:
        pub.publish("dev/1/status", b"idle", retain=True)
        pub.publish("dev/2/status", b"busy", retain=True)
        pub.publish("dev/3/status", b"not kept")
        late = MemoryTransport(broker, "late")
        got: dict[str, bytes] = {}
        late.subscribe("dev/+/status", lambda t, p: got.__setitem__(t, p))
        assert got == {"dev/1/status": b"idle", "dev/2/status": b"busy"}
        # An empty retained payload clears the retained message.
        pub.publish("dev/1/status", b"", retain=True)
        later = MemoryTransport(broker, "later")
        got2: dict[str, bytes] = {}
        later.subscribe("dev/+/status", lambda t, p: got2.__setitem__(t, p))
        assert got2 == {"dev/2/status": b"busy"}
        late.close()
        later.close()
    finally:
        pub.close()


def test_a_topics_handlers_follow_every_change_of_the_subscriptions() -> None:
    """The handlers matched for a topic are kept between messages; a subscription added or removed counts."""
    broker = MemoryBroker()
    sender, receiver = MemoryTransport(broker, "a"), MemoryTransport(broker, "b")
    wide: list[str] = []
    narrow: list[str] = []
    try:
        receiver.subscribe("data/#", lambda t, p: wide.append(t))
        sender.publish("data/x", b"1")
        receiver.subscribe("data/+", lambda t, p: narrow.append(t))
        sender.publish("data/x", b"2")
        receiver.unsubscribe("data/#")
        sender.publish("data/x", b"3")
        assert wide == ["data/x", "data/x"]
        assert narrow == ["data/x", "data/x"]
    finally:
        sender.close()
        receiver.close()
