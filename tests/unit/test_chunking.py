"""Chunking (``protocol/chunking.py``): split and reassemble, integrity, bounds on partials."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import cbor2
import pytest
from cbor2 import CBORTag
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeagent.errors import ProtocolError
from edgeagent.protocol.chunking import CHUNK_TAG, Reassembler, is_chunk, split_payload

FRAME_OVERHEAD = 96


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.integers(min_value=0, max_value=12_000),
    chunk_size=st.integers(min_value=FRAME_OVERHEAD + 1, max_value=5_000),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    dups=st.integers(min_value=0, max_value=5),
)
def test_chunking_round_trip_hypothesis(size: int, chunk_size: int, seed: int, dups: int) -> None:
    rng = random.Random(seed)
    payload = rng.randbytes(size)
    frames = split_payload(payload, chunk_size)
    if size <= chunk_size:
        assert frames == [payload]
        return
    assert len(frames) >= 2
    assert all(is_chunk(f) and len(f) <= chunk_size for f in frames)
    order = frames[:]
    rng.shuffle(order)
    # Duplicates (QoS 1 redelivery) of frames already seen, all before the last distinct frame.
    head, last = order[:-1], order[-1]
    head += [rng.choice(head) for _ in range(dups)]
    rng.shuffle(head)
    r = Reassembler()
    for frame in head:
        assert r.feed("topic/a", frame) is None
    assert r.pending == 1
    assert r.feed("topic/a", last) == payload
    assert r.pending == 0


@pytest.mark.parametrize("size", [0, 1, 999, 1000])
def test_payload_at_or_below_limit_is_not_chunked(size: int) -> None:
    payload = b"\x07" * size
    assert split_payload(payload, 1000) == [payload]


def test_payload_above_limit_is_chunked() -> None:
    payload = bytes(range(256)) * 4 + b"!"  # 1025 bytes
    frames = split_payload(payload, 1024)
    assert len(frames) == 2
    assert all(is_chunk(f) and len(f) <= 1024 for f in frames)
    item = cbor2.loads(frames[0])
    assert item.tag == CHUNK_TAG
    msg_id, index, count, total, digest, _data = item.value
    assert (index, count, total, digest) == (0, 2, 1025, hashlib.sha256(payload).digest())
    # Two splits of the same payload use different message ids.
    assert cbor2.loads(split_payload(payload, 1024)[0]).value[0] != msg_id


@pytest.mark.parametrize("max_size", [0, 10, FRAME_OVERHEAD])
def test_split_rejects_tiny_chunk_size(max_size: int) -> None:
    with pytest.raises(ProtocolError):
        split_payload(b"x" * 1000, max_size)


def test_reassembly_keeps_sources_apart() -> None:
    payload = random.Random(1).randbytes(3000)
    frames = split_payload(payload, 1000)
    r = Reassembler()
    for f in frames[:-1]:
        assert r.feed("src/a", f) is None
        assert r.feed("src/b", f) is None
    assert r.pending == 2
    assert r.feed("src/a", frames[-1]) == payload
    assert r.feed("src/b", frames[-1]) == payload
    assert r.pending == 0


def _flip_last_byte(frame: bytes) -> bytes:
    # The data bytes are the last field of the frame, so the CBOR stays well-formed.
    return frame[:-1] + bytes([frame[-1] ^ 0x01])


@pytest.mark.parametrize("which", [0, 1, -1])
def test_flipped_byte_fails_integrity_check(which: int) -> None:
    payload = random.Random(2).randbytes(5000)
    frames = split_payload(payload, 1500)
    frames[which] = _flip_last_byte(frames[which])
    r = Reassembler()
    for f in frames[:-1]:
        assert r.feed("t", f) is None
    with pytest.raises(ProtocolError, match="integrity"):
        r.feed("t", frames[-1])
    assert r.pending == 0


def _frame(msg_id: Any, index: Any, count: Any, total: Any, digest: Any, data: Any) -> bytes:
    return cbor2.dumps(CBORTag(CHUNK_TAG, [msg_id, index, count, total, digest, data]))


def test_chunk_claiming_more_than_max_message_is_rejected() -> None:
    r = Reassembler(max_message=1000)
    frames = split_payload(b"y" * 1500, 500)
    with pytest.raises(ProtocolError, match="limit 1000"):
        r.feed("t", frames[0])
    with pytest.raises(ProtocolError):
        r.feed("t", _frame("m", 0, 1, 1001, b"\x00" * 32, b""))
    assert r.pending == 0
    # Exactly at the limit is fine.
    ok = b"z" * 1000
    frames = split_payload(ok, 400)
    results = [r.feed("t", f) for f in frames]
    assert results[-1] == ok


def test_chunk_with_more_data_than_announced_is_rejected() -> None:
    r = Reassembler()
    digest = hashlib.sha256(b"abcd").digest()
    assert r.feed("t", _frame("m", 0, 3, 4, digest, b"abc")) is None
    with pytest.raises(ProtocolError, match="more than"):
        r.feed("t", _frame("m", 1, 3, 4, digest, b"def"))
    assert r.pending == 0


def test_chunk_disagreeing_with_earlier_chunks_is_rejected() -> None:
    r = Reassembler()
    digest = hashlib.sha256(b"abcdef").digest()
    assert r.feed("t", _frame("m", 0, 2, 6, digest, b"abc")) is None
    with pytest.raises(ProtocolError, match="disagrees"):
        r.feed("t", _frame("m", 1, 3, 6, digest, b"def"))
    assert r.pending == 0


def test_pending_partials_are_bounded_before_anything_is_kept() -> None:
    r = Reassembler(max_pending=3)
    messages = [random.Random(i).randbytes(700) for i in range(5)]
    split = [split_payload(m, 500) for m in messages]
    assert all(len(frames) == 2 for frames in split)
    for i, frames in enumerate(split[:3]):
        assert r.feed(f"t{i}", frames[0], now=float(i)) is None
    # No room for more: the newcomers are refused (nothing of them kept), the partials already in stay.
    for i, frames in enumerate(split[3:], start=3):
        with pytest.raises(ProtocolError, match="refused a 700-byte message"):
            r.feed(f"t{i}", frames[0], now=3.0)
        with pytest.raises(ProtocolError, match="refused"):  # its other chunks too
            r.feed(f"t{i}", frames[1], now=3.0)
    assert r.pending == 3
    for i, frames in enumerate(split[:3]):
        assert r.feed(f"t{i}", frames[1], now=4.0) == messages[i]
    assert r.pending == 0 and r.buffered == 0


def test_one_source_gets_a_bounded_share_and_the_others_get_through() -> None:
    r = Reassembler(max_pending_per_source=2, max_source_bytes=10_000)
    flood = [split_payload(random.Random(i).randbytes(900), 500) for i in range(50)]
    legit = random.Random(99).randbytes(2000)
    frames = split_payload(legit, 500)
    assert r.feed("other", frames[0]) is None
    refused = 0
    for pieces in flood:
        try:
            r.feed("flood", pieces[0])
        except ProtocolError:
            refused += 1
    assert refused == 48 and r.pending_from("flood") == 2
    assert r.buffered <= 2 * 500 + 500  # two flood partials' first chunks and the legit one's
    for frame in frames[1:-1]:
        assert r.feed("other", frame) is None
    assert r.feed("other", frames[-1]) == legit
    # Bytes: a source announcing more than its share is refused at the first chunk.
    with pytest.raises(ProtocolError, match="announce 0 bytes already"):
        r.feed("greedy", _frame("g", 0, 3, 10_001, b"\0" * 32, b"x"))
    assert r.pending_from("greedy") == 0


def test_a_partial_lives_as_long_as_its_chunks_keep_coming() -> None:
    # A slow link: a chunk every 50 s, far more than a minute in all; never cut off while it moves.
    payload = random.Random(3).randbytes(5000)
    frames = split_payload(payload, 600)
    r = Reassembler(floor=60.0)
    for i, f in enumerate(frames[:-1]):
        assert r.feed("t", f, now=100.0 + 50.0 * i) is None
    assert r.feed("t", frames[-1], now=100.0 + 50.0 * (len(frames) - 1)) == payload

    # Chunks that stop: forgotten after 4x the longest gap so far (at least the floor), and said so.
    r = Reassembler(floor=60.0)
    assert r.feed("t", frames[0], now=0.0) is None
    assert r.feed("t", frames[1], now=30.0) is None  # gap 30 s: kept for 120 s more
    other = split_payload(b"o" * 700, 500)
    assert r.feed("u", other[0], now=149.0) is None
    assert r.pending == 2
    assert r.feed("u", other[1], now=150.5) == b"o" * 700  # expires the first partial
    assert r.pending == 0 and r.expired == 1
    assert r.feed("t", frames[2], now=151.0) is None  # a fresh partial, not a completion
    assert r.pending == 1


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"garbage", id="garbage"),
        pytest.param(b"\xd9\x9c\x41", id="prefix-only"),
        pytest.param(b"\xd9\x9c\x41\xff\xff", id="prefix-then-garbage"),
        pytest.param(cbor2.dumps([1, 2, 3]), id="not-a-tag"),
        pytest.param(cbor2.dumps(CBORTag(40002, ["m", 0, 1, 1, b"", b"x"])), id="other-tag"),
        pytest.param(cbor2.dumps(CBORTag(CHUNK_TAG, "m")), id="tag-around-string"),
        pytest.param(cbor2.dumps(CBORTag(CHUNK_TAG, ["m", 0, 1, 1, b"d"])), id="five-fields"),
        pytest.param(_frame(1, 0, 1, 1, b"d" * 32, b"x"), id="msg-id-not-str"),
        pytest.param(_frame("m", "0", 1, 1, b"d" * 32, b"x"), id="index-not-int"),
        pytest.param(_frame("m", 0, 1, 1, "digest", b"x"), id="digest-not-bytes"),
        pytest.param(_frame("m", 0, 1, 1, b"d" * 32, "x"), id="data-not-bytes"),
        pytest.param(_frame("m", 2, 2, 1, b"d" * 32, b"x"), id="index-out-of-range"),
        pytest.param(_frame("m", -1, 2, 1, b"d" * 32, b"x"), id="negative-index"),
        pytest.param(_frame("m", 0, 1, -1, b"d" * 32, b""), id="negative-total"),
    ],
)
def test_garbage_frames_raise_protocol_error(frame: bytes) -> None:
    r = Reassembler()
    with pytest.raises(ProtocolError):
        r.feed("t", frame)
    assert r.pending == 0


def test_single_frame_message_with_bad_digest_is_rejected() -> None:
    r = Reassembler()
    with pytest.raises(ProtocolError, match="integrity"):
        r.feed("t", _frame("m", 0, 1, 1, b"\x00" * 32, b"x"))
