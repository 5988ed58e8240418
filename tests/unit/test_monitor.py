"""The live monitor's pure state (no broker) and its behaviour without a broker."""

from __future__ import annotations

import time
import typing
from typing import Any

import pytest
from rich.console import Console

from edgeagent.errors import EdgeAgentError
from edgeagent.ops.monitor import LEFT_GRACE, ClusterState, run_monitor, subscriptions, summarize
from edgeagent.ops.monitor.view import STATE_STYLES, render
from edgeagent.protocol.messages import (
    Announce,
    ErrorReport,
    Event,
    Heartbeat,
    Message,
    Metrics,
    Status,
    StatusState,
)
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import encode

CLUSTER = "lab"
RUN = "3f2a9c0d1e4b"


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def text_of(state: ClusterState, width: int = 160) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(render(state))
    return console.export_text()


def feed(state: ClusterState, topic: str, message: Message, sender: str) -> None:
    state.apply(topic, encode(message, sender=sender))


def device(
    state: ClusterState, family: Family, device_id: str, message: Message, cluster: str = CLUSTER
) -> None:
    feed(state, Topics(cluster).device(family, device_id), message, device_id)


def event(state: ClusterState, name: str, cluster: str = CLUSTER, **details: Any) -> None:
    msg = Event(name=name, run_id=RUN, details=details)
    feed(state, Topics(cluster).fixed(Family.EVENTS), msg, "central")


def worker_metrics(stage: int, sps: float, **extra: Any) -> dict[str, Any]:
    return {
        "stage": stage,
        "batches": 240,
        "samples_per_second": sps,
        "compute_s": 6.0,
        "communication_s": 3.0,
        "idle_s": 1.0,
        "wall_s": 10.0,
        "loss": None,
        "compression_ratio": 4.0,
        "slowdown": 1.0,
        "link_mbps": None,
        **extra,
    }


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def running(clock: FakeClock) -> ClusterState:
    """Central plus two workers in the middle of a run, with a few events."""
    state = ClusterState(clock=clock, wall=lambda: 1_700_000_000.0)
    for dev, stage in (("central", 0), ("worker-1", 1), ("worker-2", 2)):
        device(state, Family.STATUS, dev, Status(device_id=dev, state="training", run_id=RUN, stage=stage))
        device(
            state,
            Family.HEARTBEAT,
            dev,
            Heartbeat(device_id=dev, seq=7, run_id=RUN, stage=stage, interval=1.0),
        )
    central = worker_metrics(0, 512.5, loss=0.3123, accuracy=0.874)
    central |= {"points": [0, 11, 18, 21], "workers": ["central", "worker-1", "worker-2"]}
    device(state, Family.METRICS, "central", Metrics(device_id="central", values=central, run_id=RUN))
    device(
        state,
        Family.METRICS,
        "worker-1",
        Metrics(device_id="worker-1", values=worker_metrics(1, 498.25), run_id=RUN),
    )
    event(state, "partition", points=[0, 11, 18, 21], batch=0, plan_id=1, workers=["central", "worker-1"])
    event(state, "epoch", epoch=2, accuracy=0.912, loss=0.31, batch=129)
    return state


def test_devices_run_and_events_are_rendered(running: ClusterState, clock: FakeClock) -> None:
    clock.now += 0.4
    text = text_of(running)
    for expected in ("central", "worker-1", "worker-2", "training", CLUSTER, RUN):
        assert expected in text
    assert "512.5" in text and "498.2" in text  # samples/s
    assert "60 / 30 / 10" in text  # compute/comm/idle % of wall
    assert "0.312" in text  # the central node's loss
    assert "4.0x" in text  # compression ratio
    assert "0.4 s ago" in text
    assert "partition [0, 11, 18, 21] at batch 0" in text
    assert "epoch 2: 91.2%" in text
    assert "accuracy 91.2% after epoch 2" in text
    assert "3 stages" in text
    assert "layers [11, 18)" in text
    assert running.dropped == 0
    # Stages in the table, one row per device, in pipeline order.
    rows = [line for line in text.splitlines() if "training" in line]
    assert [r.split("│")[1].strip() for r in rows] == ["central", "worker-1", "worker-2"]
    assert [r.split("│")[4].strip() for r in rows] == ["0", "1", "2"]


def test_events_are_newest_first_and_bounded(clock: FakeClock) -> None:
    state = ClusterState(clock=clock, max_events=3)
    event(state, "partition", points=[0, 11, 21], batch=0, plan_id=1, workers=["central", "worker-1"])
    event(state, "epoch", epoch=0, accuracy=0.5, loss=1.2, batch=40)
    event(state, "slowdown", device="worker-1", slowdown=6.0, batch=50)
    event(state, "fault", batch=205, reason="missed heartbeats", devices=["worker-1"])
    event(
        state,
        "recovery",
        case=3,
        devices=["worker-1"],
        lost=["worker-1"],
        restarted=[],
        batch=205,
        rolled_back_to=200,
        points=[0, 21],
        workers=[],
    )
    assert len(state.events) == 3
    text = text_of(state)
    lines = [line for line in text.splitlines() if "recovery case" in line or "fault at" in line]
    assert "recovery case 3: lost worker-1, rolled back to 200" in lines[0]
    assert "fault at batch 205: worker-1 (missed heartbeats)" in lines[1]
    assert "slowdown worker-1 6.0x at batch 50" in text
    assert "partition [0, 11, 21]" not in text  # pushed out
    assert "1 recovery" in text and "1 stage" in text  # the recovery's split replaces the old one


def test_summaries_of_every_event() -> None:
    assert summarize("join", {"device": "worker-3", "batch": 300}) == "join worker-3 at batch 300"
    assert summarize("epoch", {"epoch": 1, "accuracy": 0.9, "loss": 0.25}) == "epoch 1: 90.0%, loss 0.250"
    assert (
        summarize("compression", {"forward": [8, 32], "backward": [32, 8], "epoch": 1})
        == "compression forward [8, off], backward [off, 8] (epoch 1)"
    )
    restarted = {"case": 2, "lost": [], "restarted": ["worker-2"], "rolled_back_to": 100}
    assert (
        summarize("recovery", restarted)
        == "recovery case 2: lost nothing, restarted worker-2, rolled back to 100"
    )
    # Odd details never raise: they fall back to key=value.
    assert summarize("slowdown", {"device": "w", "slowdown": "fast"}) == "slowdown device=w, slowdown=fast"
    assert summarize("mystery", {"a": 1}) == "mystery a=1"
    assert len(summarize("fault", {"reason": "x" * 500})) <= 110


def test_heartbeat_age_uses_the_injected_clock(clock: FakeClock) -> None:
    state = ClusterState(clock=clock)
    device(state, Family.STATUS, "w1", Status(device_id="w1", state="training", stage=1))
    device(state, Family.HEARTBEAT, "w1", Heartbeat(device_id="w1", seq=1, stage=1, interval=0.5))
    clock.now += 1.2
    assert "1.2 s ago" in text_of(state)
    view = state.devices[(CLUSTER, "w1")]
    assert view.last_heartbeat == 100.0 and view.heartbeat_interval == 0.5
    clock.now += 90
    assert "2 min ago" in text_of(state)


def test_late_heartbeat_is_red(clock: FakeClock) -> None:
    state = ClusterState(clock=clock)
    device(state, Family.HEARTBEAT, "w1", Heartbeat(device_id="w1", seq=1, stage=1, interval=1.0))

    def heartbeat_style() -> str:
        console = Console(record=True, width=160, color_system="truecolor")
        console.print(render(state))
        html = console.export_html(inline_styles=True)
        line = next(part for part in html.split("<span") if "s ago" in part)
        return line

    clock.now += 2.0
    assert "color: #800000" not in heartbeat_style()
    clock.now += 2.0  # 4 s > 3 intervals
    assert "color: #800000" in heartbeat_style()


def test_offline_status_shows_offline(clock: FakeClock) -> None:
    state = ClusterState(clock=clock)
    device(state, Family.STATUS, "w1", Status(device_id="w1", state="training", run_id=RUN, stage=1))
    device(state, Family.STATUS, "w2", Status(device_id="w2", state="idle"))
    device(state, Family.STATUS, "w1", Status(device_id="w1", state="offline"))
    text = text_of(state)
    row = next(line for line in text.splitlines() if "w1" in line)
    assert "offline" in row
    assert "idle" in text
    lines = text.splitlines()
    assert lines.index(next(x for x in lines if "w2" in x)) < lines.index(row)  # offline sorts last


def test_malformed_payloads_are_counted_and_never_raise(clock: FakeClock) -> None:
    state = ClusterState(clock=clock)
    status = Topics(CLUSTER).device(Family.STATUS, "w1")
    bad = [
        (status, b"\x00\xffgarbage"),
        (status, b"{not json"),
        (status, b'{"v":2,"k":"status","s":"w1","b":{"device_id":"w1","state":"idle"}}'),
        (status, b'{"v":1,"k":"status","s":"w1","b":{"device_id":"w1","state":7}}'),
        (status, b"[1, 2]"),
        ("edgeagent/v1/lab/nonsense/topic", encode(Status(device_id="w1", state="idle"), sender="w1")),
        ("something/else", b"{}"),
        ("edgeagent/v1/bad cluster!/device/w1/status", b"{}"),
        ("edgeagent/v1/lab/device/w1/metrics", b'{"v":1,"k":"metrics","s":"w1","b":{"values":1}}'),
    ]
    for topic, payload in bad:
        state.apply(topic, payload)
    assert state.dropped == len(bad)
    assert state.devices == {}
    text_of(state)  # still renders


def test_odd_metric_values_render(clock: FakeClock) -> None:
    state = ClusterState(clock=clock)
    values: dict[str, Any] = {
        "stage": "one",
        "samples_per_second": None,
        "compute_s": 1.0,
        "wall_s": 0.0,
        "loss": True,
        "points": "0,11",
    }
    device(state, Family.METRICS, "w1", Metrics(device_id="w1", values=values))
    assert state.dropped == 0
    text = text_of(state)
    assert "w1" in text


def test_data_plane_and_cbor_replies_are_ignored_not_decoded(clock: FakeClock) -> None:
    state = ClusterState(clock=clock)
    topics = Topics(CLUSTER)
    state.apply(topics.activations(0, "central"), b"\xa0not even cbor")
    state.apply(topics.device(Family.REPLY, "w1"), b"\xa0cbor ready")
    error = ErrorReport(device_id="w1", code="assign", reason="cannot build stage 1")
    device(state, Family.REPLY, "w1", error)
    assert state.dropped == 0 and state.ignored == 2
    assert "w1 [assign]: cannot build stage 1" in text_of(state)


def test_clusters_are_kept_apart_and_filtered(clock: FakeClock) -> None:
    state = ClusterState(clock=clock)
    device(state, Family.STATUS, "w1", Status(device_id="w1", state="training", stage=1), cluster="a")
    device(state, Family.STATUS, "w1", Status(device_id="w1", state="idle"), cluster="b")
    event(state, "join", cluster="b", device="w1", batch=3)
    assert {k: v.state for k, v in state.devices.items()} == {("a", "w1"): "training", ("b", "w1"): "idle"}
    text = text_of(state)
    assert "2 clusters" in text and "join w1 at batch 3" in text

    only_a = ClusterState(clock=clock, cluster="a")
    device(only_a, Family.STATUS, "w1", Status(device_id="w1", state="training", stage=1), cluster="a")
    device(only_a, Family.STATUS, "w2", Status(device_id="w2", state="idle"), cluster="b")
    assert list(only_a.devices) == [("a", "w1")] and only_a.ignored == 1


def test_dormant_clusters_are_collapsed(clock: FakeClock) -> None:
    state = ClusterState(clock=clock)
    for n in range(3):
        device(state, Family.STATUS, "w1", Status(device_id="w1", state="offline"), cluster=f"old-{n}")
    device(state, Family.STATUS, "w9", Status(device_id="w9", state="training", stage=1), cluster="live")
    text = text_of(state)
    assert "w9" in text and "old-0" not in text
    assert "3 offline devices of 3 dormant clusters hidden" in text


def test_empty_retained_status_forgets_the_device(clock: FakeClock) -> None:
    state = ClusterState(clock=clock)
    device(state, Family.STATUS, "w1", Status(device_id="w1", state="idle"))
    state.apply(Topics(CLUSTER).device(Family.STATUS, "w1"), b"")
    assert state.devices == {} and state.dropped == 0


def test_announce_registers_a_device(clock: FakeClock) -> None:
    state = ClusterState(clock=clock)
    feed(
        state,
        Topics(CLUSTER).device(Family.ANNOUNCE, "pi-4"),
        Announce(device_id="pi-4", slowdown=3.0),
        "pi-4",
    )
    text = text_of(state)
    assert "pi-4" in text and "3.0x" in text and "online" in text


def test_narrow_console_stacks_the_panels(running: ClusterState) -> None:
    text = text_of(running, width=90)
    assert "epoch 2: 91.2%" in text and "run" in text


def test_subscriptions_skip_the_data_plane() -> None:
    patterns = subscriptions()
    assert "edgeagent/v1/+/device/+/status" in patterns and "edgeagent/v1/+/run/events" in patterns
    assert not any(p.endswith(("#", "/act", "/grad")) for p in patterns)
    assert all(p.startswith("edgeagent/v1/lab/") for p in subscriptions("lab"))


def test_unreachable_broker_raises_an_error() -> None:
    """An error, not a return: `edgeagent monitor` must then exit non-zero."""
    console = Console(record=True, width=160)
    started = time.monotonic()
    with pytest.raises(EdgeAgentError, match=r"cannot reach the MQTT broker at mqtt://127.0.0.1:1\b"):
        run_monitor(
            broker="mqtt://127.0.0.1:1", refresh=0.1, duration=1.0, console=console, connect_timeout=2
        )
    assert time.monotonic() - started < 5


def row_of(text: str, device_id: str) -> str | None:
    return next((line for line in text.splitlines() if f"│ {device_id} " in line), None)


def test_a_device_seen_leaving_is_dimmed_then_hidden(running: ClusterState, clock: FakeClock) -> None:
    device(running, Family.STATUS, "worker-2", Status(device_id="worker-2", state="left", run_id=RUN))
    clock.now += 5
    text = text_of(running)
    row = row_of(text, "worker-2")
    assert row is not None and "left" in row and "left 5.0 s ago" in row  # no late heartbeat in red
    assert row_of(text, "worker-1") is not None
    lines = text.splitlines()
    assert lines.index(row) > lines.index(row_of(text, "worker-1") or "")  # sorted last
    clock.now += LEFT_GRACE
    text = text_of(running)
    assert row_of(text, "worker-2") is None and row_of(text, "worker-1") is not None
    assert "1 device that left hidden (--show-left shows them)" in text
    assert "2 devices" in text  # the header counts the devices shown


def test_a_finished_run_leaves_the_screen(running: ClusterState, clock: FakeClock) -> None:
    """The demo's end: every device leaves; a little later neither they nor the run are shown."""
    for dev in ("central", "worker-1", "worker-2"):
        device(running, Family.STATUS, dev, Status(device_id=dev, state="left", run_id=RUN))
    assert "accuracy 91.2% after epoch 2" in text_of(running)  # just finished: still there
    clock.now += LEFT_GRACE
    text = text_of(running)
    assert "no run seen yet" in text and "accuracy 91.2%" not in text
    assert "3 devices that left hidden" in text and row_of(text, "central") is None
    # A cluster where a device crashed (offline) is not finished: it stays, to be looked at.
    device(running, Family.STATUS, "worker-2", Status(device_id="worker-2", state="offline"))
    assert "accuracy 91.2% after epoch 2" in text_of(running)


def test_retained_left_statuses_are_hidden_at_once_unless_asked_for(clock: FakeClock) -> None:
    for show_left in (False, True):
        state = ClusterState(clock=clock, show_left=show_left)
        device(state, Family.STATUS, "w1", Status(device_id="w1", state="left"))
        device(state, Family.STATUS, "w2", Status(device_id="w2", state="idle"))
        text = text_of(state)
        assert row_of(text, "w2") is not None
        if show_left:
            row = row_of(text, "w1")
            assert row is not None and "left" in row
        else:
            assert row_of(text, "w1") is None and "1 device that left hidden" in text


def test_left_is_not_a_problem(clock: FakeClock) -> None:
    """A cluster whose devices all left is dormant, like one whose devices are offline; nothing is red."""
    state = ClusterState(clock=clock, show_left=True)
    device(state, Family.STATUS, "w1", Status(device_id="w1", state="training", stage=1), cluster="done")
    device(state, Family.HEARTBEAT, "w1", Heartbeat(device_id="w1", seq=1, stage=1), cluster="done")
    device(state, Family.STATUS, "w1", Status(device_id="w1", state="left"), cluster="done")
    clock.now += 600  # ten minutes without a heartbeat
    console = Console(record=True, width=160, color_system="truecolor")
    console.print(render(state))
    html = console.export_html(inline_styles=True)
    assert "color: #800000" not in html  # no late heartbeat, no red state
    fresh = ClusterState(clock=clock)
    device(fresh, Family.STATUS, "w1", Status(device_id="w1", state="left"), cluster="past")
    device(fresh, Family.STATUS, "w9", Status(device_id="w9", state="training", stage=1), cluster="live")
    assert fresh._active == {"live"}


def test_a_device_that_comes_back_after_leaving_is_shown_again(clock: FakeClock) -> None:
    state = ClusterState(clock=clock)
    device(state, Family.STATUS, "w1", Status(device_id="w1", state="left"))
    assert row_of(text_of(state), "w1") is None
    device(state, Family.STATUS, "w1", Status(device_id="w1", state="idle"))
    row = row_of(text_of(state), "w1")
    assert row is not None and "idle" in row and state.devices[(CLUSTER, "w1")].left_at is None


def test_an_unknown_state_is_shown_not_dropped(clock: FakeClock) -> None:
    state = ClusterState(clock=clock)
    newer = Status(device_id="w1", state="rebooting")  # type: ignore[arg-type]  # a newer device's state
    device(state, Family.STATUS, "w1", newer)
    row = row_of(text_of(state), "w1")
    assert row is not None and "rebooting" in row and state.dropped == 0


def test_every_status_state_has_a_style() -> None:
    assert set(STATE_STYLES) == set(typing.get_args(StatusState))


def test_replicated_stages_and_failovers_are_shown(clock: FakeClock) -> None:
    """Hybrid stages: a stage held by several devices lists them; a failover is counted and summarised."""
    state = ClusterState(clock=clock, wall=lambda: 1_700_000_000.0)
    central = worker_metrics(0, 300.0, accuracy=0.5)
    central |= {
        "points": [0, 1, 3],
        "workers": ["worker-1"],
        "groups": [["central"], ["worker-1", "worker-2", "worker-3"]],
    }
    device(state, Family.METRICS, "central", Metrics(device_id="central", values=central, run_id=RUN))
    text = text_of(state)
    assert "worker-1 + worker-2 + worker-3  (x3)" in text
    event(
        state,
        "failover",
        batch=40,
        devices=["worker-2"],
        stages=[1],
        groups=[["central"], ["worker-1", "worker-3"]],
    )
    text = text_of(state, width=220)
    assert "worker-1 + worker-3  (x2)" in text and "worker-2 +" not in text
    assert "1 failover" in text
    assert "failover at batch 40: worker-2 gone, stage 1 goes on (no rollback)" in text
    # Malformed groups from the network are ignored, not shown.
    central["groups"] = "not a list"
    device(state, Family.METRICS, "central", Metrics(device_id="central", values=central, run_id=RUN))
    assert "worker-1 + worker-3  (x2)" in text_of(state)
