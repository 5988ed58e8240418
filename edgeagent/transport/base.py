"""The transport interface the roles talk through.

Two implementations: :class:`~edgeagent.transport.mqtt.MqttTransport` (paho, any MQTT 3.1.1 broker)
and :class:`~edgeagent.transport.memory.MemoryTransport` (in-process, for unit tests of pure logic).
Handlers receive whole payloads: chunking is the transport's business.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable

from edgeagent.protocol.topics import topic_matches

Handler = Callable[[str, bytes], None]
log = logging.getLogger(__name__)
ROUTES_KEPT = 256  # topics whose handlers a transport keeps matched (Transport._dispatch)


class Transport(ABC):
    """Publish bytes to topics and dispatch received payloads to handlers by topic pattern."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self._handlers: dict[str, list[Handler]] = {}
        self._lock = threading.RLock()
        # The handlers of every topic delivered lately (what ``_dispatch`` would match again per message),
        # dropped at every change of the subscriptions and when it holds ROUTES_KEPT topics.
        self._routes: dict[str, list[Handler]] = {}
        self._on_connect: list[Callable[[], None]] = []

    @abstractmethod
    def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        """Send ``payload``; large payloads are chunked transparently."""

    @abstractmethod
    def _subscribe_remote(self, pattern: str) -> None: ...

    @abstractmethod
    def _unsubscribe_remote(self, pattern: str) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @property
    @abstractmethod
    def connected(self) -> bool: ...

    def wait_connected(self, timeout: float) -> bool:
        """Block until connected or ``timeout`` seconds pass; return whether connected."""
        return self.connected

    def publish_bulk(self, key: str, topic: str, payload: bytes, *, share: float) -> None:
        """Send a large payload of low priority (a replica) that a newer one of the same ``key`` may
        replace while it waits. A transport that emulates a slow uplink sends it in the link's idle
        time within ``share`` of it (:class:`~edgeagent.transport.mqtt.MqttTransport`); this one at once."""
        self.publish(topic, payload)

    def cancel_bulk(self) -> int:
        """Drop the bulk payloads not yet started; return how many."""
        return 0

    def pace_uplink(self, mbps: float) -> bool:
        """Pace the bulk lane on a real uplink measured at ``mbps`` (Mbit/s); returns whether it is paced.
        This one has no link to pace."""
        return False

    def flush(self, timeout: float) -> bool:
        """Block until what was published so far has reached the broker (or ``timeout`` passes)."""
        return True

    def subscribe(self, pattern: str, handler: Handler) -> None:
        with self._lock:
            first = pattern not in self._handlers
            handlers = self._handlers.setdefault(pattern, [])
            if handler in handlers:
                return  # already subscribed: a second copy would deliver every message twice
            handlers.append(handler)
            self._routes.clear()
        if first:
            self._subscribe_remote(pattern)

    def unsubscribe(self, pattern: str) -> None:
        with self._lock:
            known = self._handlers.pop(pattern, None) is not None
            self._routes.clear()
        if known:
            self._unsubscribe_remote(pattern)

    def on_connect(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` after every (re)connection, e.g. to republish a retained status."""
        self._on_connect.append(callback)

    def _patterns(self) -> list[str]:
        with self._lock:
            return list(self._handlers)

    def _dispatch(self, topic: str, payload: bytes) -> None:
        with self._lock:
            targets = self._routes.get(topic)
            if targets is None:
                targets = [h for p, hs in self._handlers.items() if topic_matches(p, topic) for h in hs]
                if len(self._routes) >= ROUTES_KEPT:  # topics a broker delivers through wildcards are many
                    self._routes.clear()
                self._routes[topic] = targets
        for handler in targets:
            try:
                handler(topic, payload)
            except Exception:
                # A handler bug must not kill the network thread; say where it happened.
                log.exception(
                    "handler for %s failed on a %d-byte payload; message dropped", topic, len(payload)
                )

    def _connected(self) -> None:
        for callback in list(self._on_connect):
            try:
                callback()
            except Exception:
                log.exception("on-connect callback failed")
