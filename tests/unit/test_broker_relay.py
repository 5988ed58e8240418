"""broker/relay.py: amqtt's relay loop without its per-message debug formatting, same decisions."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from amqtt.broker import Broker
from amqtt.contexts import Action

from edgeagent.broker.relay import applies, run_broadcast


@dataclass
class _Transitions:
    state: str


@dataclass
class _Session:
    client_id: str
    state: str = "connected"
    clean_session: bool = True
    is_anonymous: bool = False
    transitions: _Transitions = field(init=False)

    def __post_init__(self) -> None:
        self.transitions = _Transitions(self.state)


class _Handler:
    def __init__(self, log: list[tuple[str, str, bytes, int]], client_id: str) -> None:
        self.log, self.client_id = log, client_id

    async def mqtt_publish(self, topic: str, data: bytes, qos: int, retain: bool) -> None:
        self.log.append((self.client_id, topic, data, qos))


class _FakeBroker:
    """What run_broadcast uses of amqtt's Broker; _matches is amqtt's own."""

    _matches = Broker._matches

    def __init__(self, subscriptions: dict[str, list[tuple[_Session, int]]], denied: set[str]) -> None:
        self._subscriptions = subscriptions
        self._broadcast_queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.logger = logging.getLogger("test.relay")
        self.denied = denied
        self.published: list[tuple[str, str, bytes, int]] = []
        self.retained: list[tuple[str, int]] = []

    async def _topic_filtering(self, session: _Session, topic: str, action: Action) -> bool:
        assert action == Action.RECEIVE
        return session.client_id not in self.denied

    async def _retain_broadcast_message(self, broadcast: dict[str, Any], qos: int, session: _Session) -> None:
        self.retained.append((session.client_id, qos))

    def _get_handler(self, session: _Session) -> _Handler:
        return _Handler(self.published, session.client_id)


def _relay(broker: _FakeBroker, message: dict[str, Any]) -> None:
    async def go() -> None:
        await broker._broadcast_queue.put(message)
        tasks: Any = []
        await run_broadcast(broker, tasks)
        await asyncio.gather(*tasks)

    asyncio.run(go())


def test_relays_to_matching_allowed_connected_subscribers_and_retains_for_offline_persistent() -> None:
    a, b, c = _Session("a"), _Session("b"), _Session("c")
    offline = _Session("d", state="disconnected", clean_session=False)
    offline_clean = _Session("e", state="disconnected")
    broker = _FakeBroker(
        {
            "edge/+/act": [(a, 1), (c, 1), (offline, 1), (offline_clean, 1)],
            "edge/#": [(b, 0)],
            "other/+": [(a, 1)],
        },
        denied={"c"},
    )
    payload = b"\x00" * 1000
    _relay(broker, {"topic": "edge/1/act", "data": payload, "session": a})
    assert sorted((who, topic, qos) for who, topic, _, qos in broker.published) == [
        ("a", "edge/1/act", 1),
        ("b", "edge/1/act", 0),
    ]
    assert broker.retained == [("d", 1)]  # c may not read it; e's clean session keeps nothing


def test_debug_lines_do_not_carry_the_payload(caplog: pytest.LogCaptureFixture) -> None:
    a = _Session("a")
    broker = _FakeBroker({"t/#": [(a, 1)]}, denied=set())
    payload = bytes(range(256)) * 8
    with caplog.at_level(logging.DEBUG, logger="test.relay"):
        _relay(broker, {"topic": "t/x", "data": payload, "session": a})
    assert broker.published
    assert any("2048 bytes" in r.getMessage() for r in caplog.records)
    assert all(repr(payload[:32]) not in r.getMessage() for r in caplog.records)


def test_applies_only_to_the_copied_versions() -> None:
    assert applies("0.12.1")
    assert not applies("0.13.0")
    assert not applies("0.11.2")
