"""Splitting large payloads into broker-sized chunks and putting them back together.

A chunk is ``Tag(40001, [msg_id, index, count, total_len, sha256(payload), data])`` in CBOR, published
on the same topic as the message it belongs to. The receiver keeps at most ``max_pending`` partial
messages of at most ``max_message`` bytes each and forgets partials older than ``timeout`` seconds, so
a sender that dies half-way (or a flood of bogus chunks) cannot make it buffer without bound.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import cbor2
from cbor2 import CBORTag

from edgeagent.errors import ProtocolError

CHUNK_TAG = 40001
CHUNK_PREFIX = b"\xd9\x9c\x41"  # how CBOR encodes tag 40001; a whole message never starts so
DEFAULT_CHUNK_SIZE = 768 * 1024  # under the 1 MB limit some brokers set, with room for headers
_FRAME_OVERHEAD = 96

_counter = itertools.count()
_prefix = os.urandom(4).hex()


def new_message_id() -> str:
    """A process-unique id for one chunked message."""
    return f"{_prefix}-{next(_counter)}"


def is_chunk(payload: bytes) -> bool:
    return payload.startswith(CHUNK_PREFIX)


def split_payload(payload: bytes, max_size: int = DEFAULT_CHUNK_SIZE) -> list[bytes]:
    """Return ``[payload]`` when it fits in ``max_size`` bytes, else the encoded chunk frames."""
    if max_size <= _FRAME_OVERHEAD:
        raise ProtocolError(f"chunk size {max_size} must exceed {_FRAME_OVERHEAD} bytes of framing")
    if len(payload) <= max_size:
        return [payload]
    step = max_size - _FRAME_OVERHEAD
    view = memoryview(payload)
    count = (len(payload) + step - 1) // step
    digest = hashlib.sha256(payload).digest()
    msg_id = new_message_id()
    return [
        cbor2.dumps(
            CBORTag(
                CHUNK_TAG, [msg_id, i, count, len(payload), digest, bytes(view[i * step : (i + 1) * step])]
            )
        )
        for i in range(count)
    ]


@dataclass
class _Partial:
    count: int
    total: int
    digest: bytes
    started: float
    parts: dict[int, bytes] = field(default_factory=dict)
    size: int = 0


class Reassembler:
    """Collects chunk frames per (source, message id) and returns whole, verified payloads."""

    def __init__(
        self, *, max_message: int = 256 * 1024 * 1024, max_pending: int = 64, timeout: float = 120.0
    ) -> None:
        self.max_message = max_message
        self.max_pending = max_pending
        self.timeout = timeout
        self._partials: OrderedDict[tuple[str, str], _Partial] = OrderedDict()
        # Recently completed messages: a late duplicate chunk (QoS 1 redelivery) must not start a new partial.
        self._done: OrderedDict[tuple[str, str], None] = OrderedDict()

    @property
    def pending(self) -> int:
        return len(self._partials)

    def feed(self, source: str, frame: bytes, now: float | None = None) -> bytes | None:
        """Add one chunk frame; return the whole payload once the last chunk is in.

        Raises :class:`ProtocolError` for a malformed frame, an oversized message or a failed
        integrity check (the partial message is then dropped).
        """
        now = time.monotonic() if now is None else now
        self._expire(now)
        try:
            item = cbor2.loads(frame)
        except Exception as exc:  # cbor2 raises several types for garbage
            raise ProtocolError(f"malformed chunk frame of {len(frame)} bytes: {exc}") from exc
        if (
            not isinstance(item, CBORTag)
            or item.tag != CHUNK_TAG
            or not isinstance(item.value, (list, tuple))
        ):
            raise ProtocolError("not a chunk frame")
        try:
            msg_id, index, count, total, digest, data = item.value
        except ValueError as exc:
            raise ProtocolError(f"chunk frame has {len(item.value)} fields, expected 6") from exc
        if not (
            isinstance(msg_id, str)
            and isinstance(index, int)
            and isinstance(count, int)
            and isinstance(total, int)
            and isinstance(digest, bytes)
            and isinstance(data, bytes)
        ):
            raise ProtocolError("chunk frame fields have the wrong types")
        if not 0 <= index < count or total > self.max_message or total < 0:
            raise ProtocolError(
                f"chunk {index}/{count} of a {total}-byte message rejected (limit {self.max_message} bytes)"
            )
        key = (source, msg_id)
        if key in self._done:
            return None
        partial = self._partials.get(key)
        if partial is None:
            while len(self._partials) >= self.max_pending:
                self._partials.popitem(last=False)
            partial = _Partial(count=count, total=total, digest=digest, started=now)
            self._partials[key] = partial
        if (partial.count, partial.total, partial.digest) != (count, total, digest):
            del self._partials[key]
            raise ProtocolError(f"chunk {index} of message {msg_id} disagrees with its earlier chunks")
        if index not in partial.parts:
            partial.parts[index] = data
            partial.size += len(data)
        if partial.size > total:
            del self._partials[key]
            raise ProtocolError(f"message {msg_id} got {partial.size} bytes, more than the {total} announced")
        if len(partial.parts) < count:
            return None
        del self._partials[key]
        self._done[key] = None
        while len(self._done) > 4 * self.max_pending:
            self._done.popitem(last=False)
        payload = b"".join(partial.parts[i] for i in range(count))
        if len(payload) != total or hashlib.sha256(payload).digest() != digest:
            raise ProtocolError(f"message {msg_id} failed its integrity check ({len(payload)}/{total} bytes)")
        return payload

    def _expire(self, now: float) -> None:
        while self._partials:
            key, oldest = next(iter(self._partials.items()))
            if now - oldest.started <= self.timeout:
                break
            del self._partials[key]
