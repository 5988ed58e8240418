"""An in-process broker and transport, for fast unit tests of pure logic (never for integration tests)."""

from __future__ import annotations

import threading

from edgeagent.errors import ProtocolError
from edgeagent.protocol.chunking import DEFAULT_CHUNK_SIZE, Reassembler, is_chunk, split_payload
from edgeagent.protocol.topics import topic_matches
from edgeagent.transport.base import Transport


class MemoryBroker:
    """Delivers synchronously to every subscribed :class:`MemoryTransport`; keeps retained messages."""

    def __init__(self) -> None:
        self.clients: list[MemoryTransport] = []
        self.retained: dict[str, bytes] = {}
        self.lock = threading.RLock()

    def route(self, topic: str, payload: bytes, retain: bool) -> None:
        with self.lock:
            if retain:
                if payload:
                    self.retained[topic] = payload
                else:
                    self.retained.pop(topic, None)
            clients = list(self.clients)
        for client in clients:
            if any(topic_matches(p, topic) for p in client._patterns()):
                client._receive(topic, payload)


class MemoryTransport(Transport):
    def __init__(self, broker: MemoryBroker, client_id: str, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> None:
        super().__init__(client_id)
        self.broker = broker
        self.chunk_size = chunk_size
        self._reassembler = Reassembler()
        self._open = True
        with broker.lock:
            broker.clients.append(self)

    @property
    def connected(self) -> bool:
        return self._open

    def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        if retain and len(payload) > self.chunk_size:
            # A broker keeps one retained message per topic: only the last chunk would survive.
            raise ProtocolError(
                f"retained payload to {topic} is {len(payload)} bytes; limit {self.chunk_size}"
            )
        for frame in split_payload(payload, self.chunk_size):
            self.broker.route(topic, frame, retain)

    def _subscribe_remote(self, pattern: str) -> None:
        with self.broker.lock:
            retained = [(t, p) for t, p in self.broker.retained.items() if topic_matches(pattern, t)]
        for topic, payload in retained:
            self._receive(topic, payload)

    def _unsubscribe_remote(self, pattern: str) -> None:
        pass

    def _receive(self, topic: str, payload: bytes) -> None:
        if is_chunk(payload):
            whole = self._reassembler.feed(topic, payload)
            if whole is None:
                return
            payload = whole
        self._dispatch(topic, payload)

    def close(self) -> None:
        self._open = False
        with self.broker.lock:
            if self in self.broker.clients:
                self.broker.clients.remove(self)
