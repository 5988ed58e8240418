"""Splitting large payloads into broker-sized chunks and putting them back together.

A chunk is ``Tag(40001, [msg_id, index, count, total_len, sha256(payload), data])`` in CBOR, published
on the same topic as the message it belongs to. Chunks are put back together before a role's inbox
limits see the message, so the receiver bounds what it buffers itself, *before* it keeps any byte:

* per source (the topic a chunk arrives on: under the broker's topic rights it names its publisher),
  at most ``max_pending_per_source`` partial messages announcing at most ``max_source_bytes`` in all;
* in all, at most ``max_pending`` partial messages announcing at most ``max_bytes``;
* a message of more than ``max_message`` bytes is refused at its first chunk.

A partial message counts with the size its first chunk announces, so a flood of first chunks from
one source is refused once that source's share is taken, and the other sources' messages still get
through. A partial message is forgotten (and the line says so) when its chunks stop coming: no new one
for 4x the longest gap between its chunks so far, at least a minute
(:func:`edgeagent.planner.deadlines.reassembly_stall`): a multi-MB replica on a slow link is never
cut off while it moves, and a sender that died half-way frees its share.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import cbor2
from cbor2 import CBORTag

from edgeagent.errors import ProtocolError
from edgeagent.planner.deadlines import REASSEMBLY_FLOOR, reassembly_stall

log = logging.getLogger(__name__)

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
    last: float = 0.0  # when its latest new chunk came
    gap: float = 0.0  # the longest wait between two of its chunks so far


class Reassembler:
    """Collects chunk frames per (source, message id) and returns whole, verified payloads; bounded per
    source and in all before anything is buffered (see the module doc)."""

    def __init__(
        self,
        *,
        max_message: int = 256 * 1024 * 1024,
        max_pending: int = 64,
        max_bytes: int = 1024 * 1024 * 1024,
        max_pending_per_source: int = 8,
        max_source_bytes: int | None = None,
        floor: float = REASSEMBLY_FLOOR,
    ) -> None:
        self.max_message = max_message
        self.max_pending = max_pending
        self.max_bytes = max(max_bytes, max_message)
        # A source sends its messages one after the other; a few interleave (a replica sent by one
        # thread while another answers a fetch), never more than a handful.
        self.max_pending_per_source = max_pending_per_source
        self.max_source_bytes = max_message if max_source_bytes is None else max_source_bytes
        self.floor = floor
        self.expired = 0  # partial messages forgotten because their chunks stopped coming
        self._partials: OrderedDict[tuple[str, str], _Partial] = OrderedDict()
        self._reserved = 0  # bytes the partials announce, in all
        self._by_source: Counter[str] = Counter()  # partials per source
        self._source_bytes: Counter[str] = Counter()  # bytes the partials of a source announce
        # Recently completed messages: a late duplicate chunk (QoS 1 redelivery) must not start a new partial.
        self._done: OrderedDict[tuple[str, str], None] = OrderedDict()
        # Messages refused at their first chunk: their other chunks are refused without a new decision.
        self._refused: OrderedDict[tuple[str, str], str] = OrderedDict()

    @property
    def pending(self) -> int:
        return len(self._partials)

    @property
    def buffered(self) -> int:
        """Bytes of chunks held in partial messages."""
        return sum(p.size for p in self._partials.values())

    def pending_from(self, source: str) -> int:
        return self._by_source[source]

    def feed(self, source: str, frame: bytes, now: float | None = None) -> bytes | None:
        """Add one chunk frame; return the whole payload once the last chunk is in.

        Raises :class:`ProtocolError` for a malformed frame, an oversized message, a message over the
        source's or the receiver's share (nothing of it is kept) or a failed integrity check (the
        partial message is then dropped).
        """
        now = time.monotonic() if now is None else now
        self._expire(now)
        msg_id, index, count, total, digest, data = _fields(frame)
        if not 0 <= index < count or total > self.max_message or total < 0:
            raise ProtocolError(
                f"chunk {index}/{count} of a {total}-byte message rejected (limit {self.max_message} bytes)"
            )
        key = (source, msg_id)
        if key in self._done:
            return None
        refused = self._refused.get(key)
        if refused is not None:
            raise ProtocolError(refused)
        partial = self._partials.get(key)
        if partial is None:
            partial = self._open(key, count, total, digest, now)
        if (partial.count, partial.total, partial.digest) != (count, total, digest):
            self._close(key)
            raise ProtocolError(f"chunk {index} of message {msg_id} disagrees with its earlier chunks")
        if index not in partial.parts:
            partial.parts[index] = data
            partial.size += len(data)
            partial.gap = max(partial.gap, now - partial.last)
            partial.last = now
        if partial.size > total:
            self._close(key)
            raise ProtocolError(f"message {msg_id} got {partial.size} bytes, more than the {total} announced")
        if len(partial.parts) < count:
            return None
        self._close(key)
        self._done[key] = None
        while len(self._done) > 4 * self.max_pending:
            self._done.popitem(last=False)
        payload = b"".join(partial.parts[i] for i in range(count))
        if len(payload) != total or hashlib.sha256(payload).digest() != digest:
            raise ProtocolError(f"message {msg_id} failed its integrity check ({len(payload)}/{total} bytes)")
        return payload

    def _open(self, key: tuple[str, str], count: int, total: int, digest: bytes, now: float) -> _Partial:
        """A new partial message, if the source's and the receiver's shares have room for what it
        announces; else :class:`ProtocolError` (remembered for its other chunks)."""
        source = key[0]
        why = None
        if self._by_source[source] >= self.max_pending_per_source:
            why = f"{self._by_source[source]} messages from there are being put together already"
        elif self._source_bytes[source] + total > self.max_source_bytes:
            why = f"its messages being put together announce {self._source_bytes[source]} bytes already"
        elif len(self._partials) >= self.max_pending or self._reserved + total > self.max_bytes:
            why = f"{len(self._partials)} messages ({self._reserved} bytes) are being put together in all"
        if why is not None:
            reason = (
                f"refused a {total}-byte message in {count} chunks on {source}: {why} (at most "
                f"{self.max_pending_per_source} messages, {self.max_source_bytes} bytes per source; "
                f"{self.max_pending}, {self.max_bytes} bytes in all); a flood, or a source sending faster "
                "than its link"
            )
            self._refused[key] = reason
            while len(self._refused) > 4 * self.max_pending:
                self._refused.popitem(last=False)
            raise ProtocolError(reason)
        partial = _Partial(count=count, total=total, digest=digest, started=now, last=now)
        self._partials[key] = partial
        self._reserved += total
        self._by_source[source] += 1
        self._source_bytes[source] += total
        return partial

    def _close(self, key: tuple[str, str]) -> None:
        partial = self._partials.pop(key)
        source = key[0]
        self._reserved -= partial.total
        self._by_source[source] -= 1
        self._source_bytes[source] -= partial.total
        if self._by_source[source] <= 0:
            del self._by_source[source], self._source_bytes[source]

    def _expire(self, now: float) -> None:
        for key, partial in list(self._partials.items()):
            waited = now - partial.last
            if waited <= reassembly_stall(partial.gap, floor=self.floor):
                continue
            self._close(key)
            self.expired += 1
            log.warning(
                "gave up putting together a %d-byte message on %s: %d of %d chunks came in %.0f s, none for "
                "the last %.0f s (the sender stopped, or its link dropped it)",
                partial.total,
                key[0],
                len(partial.parts),
                partial.count,
                partial.last - partial.started,
                waited,
            )


def _fields(frame: bytes) -> tuple[str, int, int, int, bytes, bytes]:
    """The six fields of a chunk frame; :class:`ProtocolError` for anything else."""
    try:
        item = cbor2.loads(frame)
    except Exception as exc:  # cbor2 raises several types for garbage
        raise ProtocolError(f"malformed chunk frame of {len(frame)} bytes: {exc}") from exc
    if not isinstance(item, CBORTag) or item.tag != CHUNK_TAG or not isinstance(item.value, (list, tuple)):
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
    return msg_id, index, count, total, digest, data
