"""The protocol against real brokers: every test here runs on the embedded amqtt and on Mosquitto.

Waiting is always done on events or polling loops with deadlines. A subscription is only trusted once
a probe message published after it has come back (a SUBSCRIBE is asynchronous in MQTT).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import paho.mqtt.client as mqtt
import pytest
import torch

from edgeagent.broker import EmbeddedBroker, free_port
from edgeagent.protocol.chunking import split_payload
from edgeagent.protocol.messages import Activation, Heartbeat, Status, StatusState
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode, encode
from edgeagent.runtime.role import Role, offline_will_for
from edgeagent.transport.mqtt import MqttTransport

CONNECT_TIMEOUT = 10.0
DELIVERY_TIMEOUT = 15.0
PROBE = b"probe"


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


class Collector:
    """A transport handler that records payloads and lets a test wait for them."""

    def __init__(self) -> None:
        self.items: list[tuple[str, bytes]] = []
        self._cond = threading.Condition()

    def __call__(self, topic: str, payload: bytes) -> None:
        with self._cond:
            self.items.append((topic, payload))
            self._cond.notify_all()

    def payloads(self) -> list[bytes]:
        with self._cond:
            return [p for _, p in self.items]

    def wait_for(self, predicate: Callable[[bytes], bool], timeout: float = DELIVERY_TIMEOUT) -> bytes | None:
        """The first recorded payload that satisfies ``predicate`` (waiting for it if need be)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for _, payload in self.items:
                    if predicate(payload):
                        return payload
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)


@contextmanager
def transports(url: str, *names: str, **kwargs: object) -> Iterator[list[MqttTransport]]:
    """Connected transports with unique client ids, closed whatever happens."""
    made: list[MqttTransport] = []
    try:
        for name in names:
            made.append(MqttTransport(url, f"{name}-{uuid.uuid4().hex[:8]}", **kwargs))  # type: ignore[arg-type]
        for t in made:
            assert t.wait_connected(CONNECT_TIMEOUT), f"{t.client_id} did not connect to {url}"
        yield made
    finally:
        for t in made:
            t.close()


def confirm_subscription(
    publisher: MqttTransport, topic: str, seen: Callable[[], bool], *, qos: int = 1, timeout: float = 10.0
) -> None:
    """Publish probes on ``topic`` until ``seen()`` says one arrived: the subscription is then live."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        publisher.publish(topic, PROBE, qos=qos)
        if wait_until(seen, 0.3):
            return
    raise AssertionError(f"no probe came back on {topic} within {timeout} s")


# ---------------------------------------------------------------------------------------------
# Chunked payloads


def test_large_payload_chunked_arrives_whole(broker_url: str, cluster: str) -> None:
    topic = Topics(cluster).activations(0, "pub")
    chunk = 256 * 1024
    payload = random.Random(5).randbytes(3 * 1024 * 1024)
    assert len(split_payload(payload, chunk)) > 10  # really chunked
    with transports(broker_url, "pub", "sub", chunk_size=chunk) as (pub, sub):
        got = Collector()
        sub.subscribe(topic, got)
        confirm_subscription(pub, topic, lambda: PROBE in got.payloads())
        pub.publish(topic, payload)
        whole = got.wait_for(lambda p: len(p) >= len(payload))
        assert whole is not None, f"no whole payload; got sizes {[len(p) for p in got.payloads()]}"
        assert whole == payload
        # Nothing but probes and the one whole payload reached the handler (no stray frames).
        assert all(p in (PROBE, payload) for p in got.payloads())
        assert sub.dropped == 0


def test_activation_with_1mib_tensor_round_trips(broker_url: str, cluster: str) -> None:
    topics = Topics(cluster)
    topic = topics.activations(2, "w2")
    x = torch.randn(256, 1024, generator=torch.Generator().manual_seed(3))  # 1 MiB of float32
    y = torch.randint(0, 10, (256,))
    msg = Activation(run_id="r", plan_id=1, stage=2, batch_id=41, version=3, mode="train", x=x, y=y)
    payload = encode(msg, sender="w2")
    assert len(payload) > 1024 * 1024
    with transports(broker_url, "pub", "sub") as (pub, sub):  # default chunk size: 768 KiB
        got = Collector()
        sub.subscribe(topic, got)
        confirm_subscription(pub, topic, lambda: PROBE in got.payloads())
        pub.publish(topic, payload)
        raw = got.wait_for(lambda p: p != PROBE)
        assert raw is not None, "the activation did not arrive"
        sender, out = decode(raw)
    assert sender == "w2"
    assert isinstance(out, Activation)
    assert (out.run_id, out.plan_id, out.stage, out.batch_id, out.version, out.mode) == (
        "r",
        1,
        2,
        41,
        3,
        "train",
    )
    assert out.x.dtype == torch.float32 and torch.equal(out.x, x)
    assert out.y.dtype == torch.int64 and torch.equal(out.y, y)


def test_corrupted_chunk_stream_is_dropped(broker_url: str, cluster: str) -> None:
    topic = Topics(cluster).gradients(1, "pub")
    chunk = 64 * 1024
    bad_payload = random.Random(6).randbytes(300 * 1024)
    good_payload = random.Random(7).randbytes(200 * 1024)
    frames = split_payload(bad_payload, chunk)
    assert len(frames) >= 3
    victim = len(frames) // 2
    # The data bytes are the frame's last field: flipping one keeps the CBOR valid, breaks the digest.
    frames[victim] = frames[victim][:-100] + bytes([frames[victim][-100] ^ 0xFF]) + frames[victim][-99:]
    with transports(broker_url, "pub", "sub", chunk_size=chunk) as (pub, sub):
        got = Collector()
        sub.subscribe(topic, got)
        confirm_subscription(pub, topic, lambda: PROBE in got.payloads())
        for frame in frames:  # raw frames, straight through the paho client
            info = pub._client.publish(topic, frame, qos=1)
            assert info.rc == mqtt.MQTT_ERR_SUCCESS
        assert wait_until(lambda: sub.dropped == 1, DELIVERY_TIMEOUT), f"dropped={sub.dropped}"
        pub.publish(topic, good_payload)
        assert got.wait_for(lambda p: p == good_payload) is not None, "the good message did not arrive"
        assert sub.dropped == 1
        assert all(p in (PROBE, good_payload) for p in got.payloads()), "a corrupted payload got through"


# ---------------------------------------------------------------------------------------------
# Roles: malformed input, retained status, last will


def test_role_drops_malformed_messages_and_keeps_going(
    broker_url: str, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="edgeagent.runtime.role")
    topics = Topics(cluster)
    hb_topic = topics.device(Family.HEARTBEAT, "w1")
    with transports(broker_url, "role", "pub") as (role_transport, pub):
        role = Role(role_transport, topics, "dev")
        role.listen(topics.all())
        # Subscription check with a valid message (then drain it).
        first = Heartbeat(device_id="w1", seq=0)
        confirm_subscription_payload = encode(first, sender="w1")
        deadline = time.monotonic() + 10
        probe = None
        while probe is None and time.monotonic() < deadline:
            pub.publish(hb_topic, confirm_subscription_payload)
            probe = role.next_message(timeout=0.3)
        assert probe is not None and probe.message == first
        while role.next_message(timeout=0.5) is not None:  # duplicate probes, if any
            pass
        assert role.dropped == 0

        wrong_version = encode(Heartbeat(device_id="w1", seq=1), sender="w1").replace(b'"v":1', b'"v":99', 1)
        assert b'"v":99' in wrong_version
        pub.publish(hb_topic, b"\x00\xffgarbage\x13")
        pub.publish(hb_topic, wrong_version)
        pub.publish(f"{topics.base}/nowhere/heartbeat", encode(Heartbeat(device_id="w1", seq=2), sender="w1"))
        good = Heartbeat(device_id="w1", seq=3, run_id="r", stage=1, interval=0.5)
        pub.publish(hb_topic, encode(good, sender="w1"))

        inbound = role.next_message(timeout=DELIVERY_TIMEOUT)
        assert inbound is not None, "the valid heartbeat never reached the inbox"
        assert inbound.message == good and inbound.sender == "w1"
        assert inbound.topic.family is Family.HEARTBEAT and inbound.topic.device == "w1"
        assert wait_until(lambda: role.dropped == 3, DELIVERY_TIMEOUT), f"dropped={role.dropped}"
        assert role.next_message(timeout=0.2) is None  # nothing malformed slipped into the inbox

    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and r.name == "edgeagent.runtime.role"
    ]
    text = "\n".join(r.getMessage() for r in warnings)
    assert len(warnings) == 3, text
    assert "version 99" in text
    assert "nowhere/heartbeat" in text
    assert all("dropped" in r.getMessage() for r in warnings)


def test_retained_status_reaches_new_subscriber(broker_url: str, cluster: str) -> None:
    topics = Topics(cluster)
    status_topic = topics.device(Family.STATUS, "dev")
    with transports(broker_url, "role") as (role_transport,):
        own = Collector()
        role_transport.subscribe(status_topic, own)
        confirm_subscription(role_transport, status_topic, lambda: PROBE in own.payloads())
        role = Role(role_transport, topics, "dev")
        role.set_status("idle", run_id="run-9", stage=2, detail="ready")
        # Seen by the publisher itself: the broker has stored it before the new subscriber exists.
        assert own.wait_for(lambda p: p != PROBE) is not None
        with transports(broker_url, "late") as (late,):
            got = Collector()
            late.subscribe(topics.devices(Family.STATUS), got)
            raw = got.wait_for(lambda p: p != PROBE)
            assert raw is not None, "the new subscriber did not get the retained status"
            sender, msg = decode(raw)
            assert sender == "dev"
            assert msg == Status(device_id="dev", state="idle", run_id="run-9", stage=2, detail="ready")


def test_last_will_publishes_offline_status(broker_url: str, cluster: str) -> None:
    topics = Topics(cluster)
    will_topic, _ = offline_will_for(topics, "w1")
    with transports(broker_url, "watcher") as (watcher,):
        got = Collector()
        watcher.subscribe(topics.devices(Family.STATUS), got)
        dying = MqttTransport(broker_url, f"w1-{uuid.uuid4().hex[:8]}", will=offline_will_for(topics, "w1"))
        try:
            assert dying.wait_connected(CONNECT_TIMEOUT)
            role = Role(dying, topics, "w1")
            role.set_status("online")

            def state_seen(state: StatusState) -> Callable[[bytes], bool]:
                return lambda p: decode(p)[1] == Status(device_id="w1", state=state)

            # The watcher's subscription is live once it sees the online status.
            assert got.wait_for(state_seen("online")) is not None
            assert got.wait_for(state_seen("offline"), timeout=0.5) is None
            dying.kill()
            assert not dying.connected
            assert got.wait_for(state_seen("offline"), timeout=20.0) is not None, "no last will within 20 s"
        finally:
            dying.close()
        assert all(topic == will_topic for topic, _ in got.items)


# ---------------------------------------------------------------------------------------------
# Reconnection (amqtt only: the embedded broker can be stopped and restarted on the same port)


def test_transport_reconnects_after_broker_restart(cluster: str) -> None:
    topic = Topics(cluster).fixed(Family.EVENTS)
    broker = EmbeddedBroker(port=free_port()).start()
    sub: MqttTransport | None = None
    pub: MqttTransport | None = None
    try:
        sub = MqttTransport(broker.url, f"sub-{cluster}", max_backoff=1.0)
        assert sub.wait_connected(CONNECT_TIMEOUT)
        got = Collector()
        sub.subscribe(topic, got)
        # QoS 0 probes: no PUBACK is in flight when the broker stops. (amqtt on Python 3.11 can hang in
        # shutdown when a packet arrives just as it cancels the client's reader task.)
        confirm_subscription(sub, topic, lambda: PROBE in got.payloads(), qos=0)
        thread = broker._thread
        broker.stop()
        assert thread is not None and not thread.is_alive(), "the embedded broker did not shut down"
        assert wait_until(lambda: not sub.connected, 10.0), "the transport did not notice the broker going"

        broker.start()
        assert sub.wait_connected(15.0), "the transport did not reconnect after the broker restart"
        pub = MqttTransport(broker.url, f"pub-{cluster}")
        assert pub.wait_connected(CONNECT_TIMEOUT)
        after = b"after the restart"
        deadline = time.monotonic() + DELIVERY_TIMEOUT
        while got.wait_for(lambda p: p == after, timeout=0.3) is None:
            assert time.monotonic() < deadline, "the subscription was not restored after reconnecting"
            pub.publish(topic, after)
    finally:
        for t in (pub, sub):
            if t is not None:
                t.close()
        broker.stop()


def test_embedded_broker_stops_under_load_and_frees_its_port(cluster: str) -> None:
    """amqtt 0.12 on 3.11 can hang for good in its shutdown while QoS 1 packets are in flight (a reader
    swallows its cancellation; ``asyncio.run`` then waits for it for ever). ``stop()`` is bounded anyway:
    the thread ends, the clients see the broker go, and the port takes a new broker."""
    broker = EmbeddedBroker(port=free_port()).start()
    topic = Topics(cluster).fixed(Family.EVENTS)
    gone = threading.Event()
    received = [0]  # messages the flood brought back to its subscribers
    clients: list[mqtt.Client] = []

    def flood(client: mqtt.Client) -> None:
        while not gone.is_set():
            client.publish(topic, b"x" * 20_000, qos=1)
            time.sleep(0.001)  # pacing the flood, not waiting for anything

    try:
        for i in range(3):
            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"flood-{i}-{cluster}")
            client.on_disconnect = lambda *_: gone.set()
            client.on_message = lambda *_: received.__setitem__(0, received[0] + 1)
            client.connect("127.0.0.1", broker.port)
            client.subscribe(topic, qos=1)
            client.loop_start()
            clients.append(client)
            threading.Thread(target=flood, args=(client,), daemon=True).start()
        # Packets in flight both ways: the broker is delivering the flood back to its publishers.
        assert wait_until(lambda: received[0] >= 100, DELIVERY_TIMEOUT), "the flood never came back"
        thread = broker._thread
        broker.stop()
        assert thread is not None and not thread.is_alive(), "the embedded broker's thread did not end"
        assert gone.wait(CONNECT_TIMEOUT), "no client noticed the broker going"
        broker.start()  # the same port
        probe = MqttTransport(broker.url, f"probe-{cluster}")
        assert probe.wait_connected(CONNECT_TIMEOUT)
        probe.close()
    finally:
        gone.set()
        for client in clients:
            client.loop_stop()
            client.disconnect()
        broker.stop()


def test_a_handler_that_publishes_while_a_close_is_queued_does_not_hang(
    broker_url: str, cluster: str
) -> None:
    """Handlers run on paho's network thread under its callback lock. A PUBLISH from one (a probe's echo)
    must not write the queue itself: a DISCONNECT queued meanwhile (a close racing it) would then report
    the disconnection under the same lock, and the network thread would wait for itself for ever (it
    hung a CI run once). The handler holds on until the DISCONNECT is queued, then publishes."""
    topics = Topics(cluster)
    topic, reply = topics.activations(0, "go"), topics.activations(0, "echo")
    entered, queued, answered = threading.Event(), threading.Event(), threading.Event()
    echo = MqttTransport(broker_url, f"echo-{uuid.uuid4().hex[:8]}")

    def handler(_topic: str, payload: bytes) -> None:
        if payload != b"go":
            return
        entered.set()
        if queued.wait(DELIVERY_TIMEOUT):
            echo.publish(reply, b"echo")
            answered.set()

    try:
        with transports(broker_url, "pub") as (pub,):
            assert echo.wait_connected(CONNECT_TIMEOUT)
            seen = Collector()
            echo.subscribe(topic, seen)
            echo.subscribe(topic, handler)
            confirm_subscription(pub, topic, lambda: PROBE in seen.payloads())
            pub.publish(topic, b"go")
            assert entered.wait(DELIVERY_TIMEOUT), "the handler never ran"
            echo._client.disconnect()  # queued for the network thread, busy in the handler
            queued.set()
            assert answered.wait(DELIVERY_TIMEOUT), "the handler's publish hung the network thread"
    finally:
        if answered.is_set() or not entered.is_set():
            echo.close()  # (a network thread that hangs in the handler would hang close() too)
