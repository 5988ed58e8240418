"""The embedded broker in its own process (the demo's): ready when it says so, relays, stops, and a
broker that cannot start says why."""

from __future__ import annotations

import threading

import pytest

from edgeagent.broker.process import BrokerProcess
from edgeagent.errors import ConfigError
from edgeagent.transport.mqtt import MqttTransport


def test_relays_between_clients_and_stops() -> None:
    with BrokerProcess() as broker:
        assert broker.alive()
        a, b = MqttTransport(broker.url, "bp-a"), MqttTransport(broker.url, "bp-b")
        try:
            assert a.wait_connected(30) and b.wait_connected(30)
            got: list[bytes] = []
            arrived = threading.Event()

            def on_message(topic: str, payload: bytes) -> None:
                got.append(payload)
                arrived.set()

            b.subscribe("bp/t", on_message)
            # The SUBACK is not observable through the transport: publish until the first one arrives.
            for _ in range(300):
                a.publish("bp/t", b"x" * 70_000)  # over one TCP segment: written in pieces
                if arrived.wait(0.1):
                    break
            assert got and got[0] == b"x" * 70_000
        finally:
            a.close()
            b.close()
        proc = broker._proc
    assert proc is not None and proc.poll() is not None  # stopped with the context


def test_a_taken_port_is_a_clear_error() -> None:
    with BrokerProcess() as first:
        with pytest.raises(ConfigError, match=rf"broker on 127.0.0.1:{first.port} exited with code"):
            BrokerProcess(port=first.port).start()
        assert first.alive()
