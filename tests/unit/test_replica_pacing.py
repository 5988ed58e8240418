"""Replicas on a slow uplink (issue 52): the bulk lane's rule (``transport.mqtt.bulk_slot``), its share of
the link, and the fallback of transports without an emulated uplink."""

from __future__ import annotations

import pytest

from edgeagent.errors import ConfigError
from edgeagent.replication.store import snapshots_kept
from edgeagent.transport.memory import MemoryBroker, MemoryTransport
from edgeagent.transport.mqtt import bulk_slot


def test_bulk_frame_goes_on_an_idle_link_when_its_turn_has_come() -> None:
    assert bulk_slot(10.0, next_free=9.0, bulk_next=10.0, duration=0.1, share=0.25, grace=1.0) == 10.0


def test_bulk_frame_waits_for_its_share_even_on_an_idle_link() -> None:
    assert bulk_slot(10.0, next_free=0.0, bulk_next=10.5, duration=0.1, share=0.25, grace=1.0) is None


def test_bulk_frame_gives_way_to_a_reserved_activation_until_its_grace_runs_out() -> None:
    busy = {"next_free": 12.0, "duration": 0.1, "share": 0.25, "grace": 1.0}
    assert bulk_slot(10.5, bulk_next=10.0, **busy) is None
    # Past its turn by more than the grace: it queues behind what is reserved (bounded time on a busy link).
    assert bulk_slot(11.0, bulk_next=10.0, **busy) == 12.0


def test_bulk_share_bounds_the_lanes_use_of_the_link() -> None:
    """Frames back to back on an idle link: the lane's own rest keeps it at ``share`` of the time."""
    now, bulk_next, busy = 0.0, 0.0, 0.0
    duration, share = 0.2, 0.25
    for _ in range(20):
        start = bulk_slot(now, 0.0, bulk_next, duration, share, 1.0)
        if start is None:
            now = bulk_next
            continue
        busy += duration
        bulk_next = start + duration / share
        now = start + duration
    assert busy / bulk_next == pytest.approx(share)


def test_bulk_share_must_be_a_fraction() -> None:
    with pytest.raises(ConfigError, match="share"):
        bulk_slot(0.0, 0.0, 0.0, 0.1, 0.0, 1.0)


def test_paced_stores_keep_more_snapshots() -> None:
    assert snapshots_kept(0.0) == 3
    assert snapshots_kept(0.25) > 3


def test_transport_without_an_emulated_uplink_sends_bulk_at_once() -> None:
    broker = MemoryBroker()
    sender, receiver = MemoryTransport(broker, "a"), MemoryTransport(broker, "b")
    got: list[bytes] = []
    receiver.subscribe("r/#", lambda t, p: got.append(p))
    try:
        sender.publish_bulk("r/x", "r/x", b"replica", share=0.25)
        assert got == [b"replica"]
        assert sender.cancel_bulk() == 0
    finally:
        sender.close()
        receiver.close()
