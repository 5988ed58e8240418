"""Replicas on a slow uplink (issue 52): the bulk lane's rule (``transport.pacing.bulk_slot``), its share of
the link, and the fallback of transports without an emulated uplink."""

from __future__ import annotations

import pytest

from edgeagent.errors import ConfigError
from edgeagent.protocol.topics import Family
from edgeagent.replication.store import snapshots_kept
from edgeagent.transport.memory import MemoryBroker, MemoryTransport
from edgeagent.transport.pacing import (
    BULK_FRAME_MIN,
    BULK_GRACE_RESTS,
    LinkThrottle,
    bulk_frame_bytes,
    bulk_grace,
    bulk_slot,
)


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


def test_bulk_frames_hold_a_link_briefly() -> None:
    # 25 ms of the link: 1,562 bytes at 0.5 Mbit/s, 12,500 at 4; at least 1 KiB, at most the chunk size.
    assert bulk_frame_bytes(62_500, 65_536) == 1562
    assert bulk_frame_bytes(500_000, 65_536) == 12_500
    assert bulk_frame_bytes(1_000, 65_536) == BULK_FRAME_MIN
    assert bulk_frame_bytes(1e9, 65_536) == 65_536


def test_bulk_lane_gets_through_a_link_that_stays_busy() -> None:
    """Activations reserve the link back to back: the lane waits its grace, then queues behind them, and
    still gets share / (1 + BULK_GRACE_RESTS) of the link."""
    duration, share = 0.025, 0.25
    grace = bulk_grace(duration, share)
    assert grace == pytest.approx(BULK_GRACE_RESTS * duration / share)
    now, next_free, bulk_next, bulk = 0.0, 0.0, 0.0, 0.0
    while now < 100.0:
        next_free = max(next_free, now) + 0.01  # an activation frame reserved every 10 ms of link
        start = bulk_slot(now, next_free, bulk_next, duration, share, grace)
        if start is not None:
            bulk += duration
            next_free = start + duration
            bulk_next = start + duration / share
        now = next_free
    assert bulk / now == pytest.approx(share / (1 + BULK_GRACE_RESTS), rel=0.05)


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


class _State:
    """What Setup.stage_topics and subscribe_stage read of a run's state."""

    def __init__(self, paced: set[str], share: float = 0.25) -> None:
        from edgeagent.config import CentralConfig
        from edgeagent.pipeline.groups import Groups
        from edgeagent.protocol.messages import Announce
        from edgeagent.protocol.topics import Topics
        from edgeagent.replication.store import WeightStore

        self.worker_list = ["central", "worker-1", "worker-2", "worker-3"]
        self.groups = Groups.single(self.worker_list)  # one device per stage
        self.topics = Topics("c")
        self.config = CentralConfig(cluster="c", replica_share=share)
        self.announced = {d: Announce(device_id=d, paces=d in paced) for d in self.worker_list[1:]}
        self.store = WeightStore("central")
        self.heard: list[str] = []
        self.paced_uplinks: dict[str, float] = {}  # real uplinks measured slow (Setup.pace_slow_uplinks)

    def listen(self, topic: str) -> None:
        self.heard.append(topic)

    def stop_listening(self, topic: str) -> None:
        self.heard.remove(topic)


def _replica_topics(paced: set[str], share: float = 0.25) -> tuple[list[str], float, int]:
    from edgeagent.modes.pipeline.central.context import RunState
    from edgeagent.modes.pipeline.central.setup import Setup

    state = _State(paced, share)
    state.paces = RunState.paces.__get__(state)  # type: ignore[attr-defined]
    state.replica_share = RunState.replica_share.__get__(state)  # type: ignore[attr-defined]
    setup = Setup(state)  # type: ignore[arg-type]
    setup.subscribe_stage()
    replicas = [t.split("/")[-2] for t in state.heard if "/replica/" in f"/{t}/"]
    keep = state.store.keep
    setup.unsubscribe_stage()
    assert state.heard == []
    return replicas, state.replica_share(), keep  # type: ignore[attr-defined]


def test_without_a_paced_uplink_the_central_hears_only_the_wrapped_chain_replica() -> None:
    """No worker paces (no emulated uplink): the paper's way, whatever replica_share says."""
    topics, share, keep = _replica_topics(paced=set())
    assert len(topics) == 1 and share == 0.0 and keep == snapshots_kept(0.0)


def test_a_paced_worker_sends_its_replicas_to_the_central_node_too() -> None:
    topics, share, keep = _replica_topics(paced={"worker-1"})
    assert len(topics) == 2 and share == 0.25 and keep == snapshots_kept(0.25)
    topics, share, _ = _replica_topics(paced={"worker-1"}, share=0.0)
    assert len(topics) == 1 and share == 0.0


def test_a_real_links_throttle_books_frames_without_holding_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real uplink (``emulate=False``) holds frames itself: the model only books them, so that the bulk
    lane finds the link's idle time; an emulated one sleeps for them."""
    import edgeagent.transport.pacing as pacing

    slept: list[float] = []
    monkeypatch.setattr(pacing.time, "sleep", slept.append)
    real, emulated = LinkThrottle(1.0, emulate=False), LinkThrottle(1.0)
    real.wait(125_000)  # 1 s of a 1 Mbit/s link
    assert slept == []
    assert real._next_free - pacing.time.monotonic() > 0.9
    emulated.wait(125_000)
    assert len(slept) == 1 and slept[0] > 0.9


def test_memory_transport_has_no_uplink_to_pace() -> None:
    broker = MemoryBroker()
    transport = MemoryTransport(broker, "a")
    try:
        assert transport.pace_uplink(0.5) is False
    finally:
        transport.close()


def _paced_after_measuring(
    uplinks_mbps: dict[str, float], *, pace_below: float = 10.0, emulated: set[str] | None = None
) -> tuple[dict[str, float], list[tuple[str, object]], _State]:
    from edgeagent.modes.pipeline.central.context import RunState
    from edgeagent.modes.pipeline.central.setup import Setup
    from edgeagent.planner.dp import Link

    state = _State(emulated or set())
    state.config = state.config.model_copy(update={"replica_pace_mbps": pace_below})
    state.run_id = "run-1"  # type: ignore[attr-defined]
    state.uplinks = {d: Link(mbps * 1e6 / 8) for d, mbps in uplinks_mbps.items()}  # type: ignore[attr-defined]
    sent: list[tuple[str, object]] = []
    state.send = lambda topic, msg: sent.append((topic, msg))  # type: ignore[attr-defined]
    state.event = lambda name, **details: sent.append((f"event {name}", details))  # type: ignore[attr-defined]
    state.paces = RunState.paces.__get__(state)  # type: ignore[attr-defined]
    state.replica_share = RunState.replica_share.__get__(state)  # type: ignore[attr-defined]
    setup = Setup(state)  # type: ignore[arg-type]
    setup.subscribe_stage()
    before = list(state.heard)
    paced = setup.pace_slow_uplinks()
    state.heard_before = before  # type: ignore[attr-defined]
    return paced, sent, state


def test_a_real_uplink_measured_slow_is_paced_once_the_links_are_measured() -> None:
    from edgeagent.protocol.commands import PaceReplicas

    paced, sent, state = _paced_after_measuring({"worker-1": 0.5, "worker-2": 94.0, "worker-3": 2.0})
    assert paced == {"worker-1": 0.5, "worker-3": 2.0}
    commands = [msg for _, msg in sent if isinstance(msg, PaceReplicas)]
    assert commands == [PaceReplicas(run_id="run-1", share=0.25, uplinks={"worker-1": 0.5, "worker-3": 2.0})]
    # The central node listens to worker-1's replica topic now (worker-3's, the last, it heard already:
    # its chain replica wraps around), and its store keeps what paced replicas need.
    new = [t for t in state.heard if t not in state.heard_before]  # type: ignore[attr-defined]
    assert new == [state.topics.device(Family.REPLICA, "worker-1")]
    assert state.store.keep == snapshots_kept(0.25)
    assert state.paces("worker-1") and not state.paces("worker-2")  # type: ignore[attr-defined]


def test_fast_uplinks_emulated_ones_and_a_zero_threshold_are_left_alone() -> None:
    assert _paced_after_measuring({"worker-1": 50.0, "worker-2": 94.0, "worker-3": 12.0})[:2] == ({}, [])
    assert _paced_after_measuring({"worker-1": 0.5}, pace_below=0.0)[:2] == ({}, [])
    # worker-1 already paces an emulated uplink (--link-mbps): only worker-2 is new.
    paced, _, _ = _paced_after_measuring({"worker-1": 0.5, "worker-2": 1.0}, emulated={"worker-1"})
    assert paced == {"worker-2": 1.0}


def test_pace_replicas_checks_its_share_and_rates() -> None:
    from edgeagent.errors import ProtocolError
    from edgeagent.protocol.commands import PaceReplicas

    with pytest.raises(ProtocolError, match="share"):
        PaceReplicas(run_id="r", share=0.0, uplinks={})
    with pytest.raises(ProtocolError, match="Mbit/s"):
        PaceReplicas(run_id="r", share=0.25, uplinks={"w": float("nan")})


def test_a_chain_replica_never_replaces_a_global_one_still_waiting() -> None:
    """The bulk lane's key is the topic and the purpose: a newer chain replica replaces an older chain one
    still waiting, never a global one (the central node checkpoints at global points)."""
    import dataclasses
    from types import SimpleNamespace

    from edgeagent.modes.pipeline.worker.replicas import Replicas
    from edgeagent.protocol.messages import MessageKind, Weights
    from tests.unit.protocol_samples import SAMPLES

    keys: list[str] = []
    transport = SimpleNamespace(publish_bulk=lambda key, topic, payload, share: keys.append(key))
    worker = SimpleNamespace(device_id="w1", transport=transport, times=SimpleNamespace(sent_bytes=0))
    replicas = Replicas(worker, SimpleNamespace(replica_share=0.25))  # type: ignore[arg-type]
    sample = SAMPLES[MessageKind.WEIGHTS]
    assert isinstance(sample, Weights)
    for purpose in ("global", "chain", "chain"):
        replicas._send_paced("c/device/w1/replica", dataclasses.replace(sample, purpose=purpose))
    assert keys[1] == keys[2] != keys[0]
