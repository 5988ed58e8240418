"""What the monitor knows: the JSON messages of any number of clusters folded into a view. Pure: no I/O,
no threads, no drawing (that is :mod:`.view`'s: :func:`~.view.render` draws a state).

A device that shuts down cleanly publishes the retained state ``left``; that is not a problem, so such
a device never makes its cluster look alive. A device seen leaving while the monitor watches stays
listed for :data:`LEFT_GRACE` seconds; one that had left before the monitor started (a retained
``left``) is hidden at once. A cluster all of whose devices have left is finished.

The monitor decodes with ``open_values``: a state or error code newer than this monitor is shown as it
is, not dropped (a monitor may be older than the devices it watches).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgeagent.errors import ProtocolError
from edgeagent.ops.monitor.summary import summarize
from edgeagent.ops.monitor.values import _clip, _int, _ints, _num, _strs
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
from edgeagent.protocol.topics import ANY, Family, TopicFilters, check_name, parse_topic
from edgeagent.protocol.wire import decode

log = logging.getLogger(__name__)

LEFT_GRACE = 30.0  # seconds a device seen leaving stays in the table before it is hidden
# States of a device that is not running and is not expected to: never shown as a live device.
GONE_STATES: tuple[StatusState, ...] = ("offline", "left")

# The families the monitor reads, all JSON. Everything else (the data plane) is not subscribed to.
SHOWN_FAMILIES = (Family.ANNOUNCE, Family.STATUS, Family.HEARTBEAT, Family.METRICS, Family.REPLY)
SHOWN_FIXED = (Family.EVENTS,)


def subscriptions(cluster: str | None = None) -> list[str]:
    """The topic patterns the monitor subscribes to: one cluster, or every cluster (``+``)."""
    tree = TopicFilters(ANY if cluster is None else check_name("cluster", cluster))
    return [tree.device(f) for f in SHOWN_FAMILIES] + [tree.fixed(f) for f in SHOWN_FIXED]


@dataclass
class DeviceView:
    """What the monitor knows about one device of one cluster."""

    device_id: str
    cluster: str = "default"
    state: str = ""  # a StatusState, or a newer one this monitor does not know; "" until a status arrives
    run_id: str = ""
    stage: int = -1
    last_heartbeat: float | None = None  # clock() when the last heartbeat arrived
    heartbeat_interval: float = 1.0
    metrics: dict[str, Any] = field(default_factory=dict)
    last_seen: float = 0.0  # clock() when any message of this device arrived
    detail: str = ""
    slowdown: float | None = None  # from announcements, until metrics say otherwise
    left_at: float | None = None  # clock() when we saw it leave (None: not seen, e.g. a retained "left")


@dataclass
class RunView:
    """The run of one cluster, from the central node's events and metrics."""

    run_id: str = ""
    central: str = ""
    points: list[int] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)
    # Hybrid stages: the devices of every stage (primary first); empty = one device per stage (workers).
    groups: list[list[str]] = field(default_factory=list)
    plan_id: int | None = None
    epoch: int | None = None
    accuracy: float | None = None  # of the latest epoch event
    loss: float | None = None
    running_accuracy: float | None = None  # the central node's metrics, between epochs
    recoveries: int = 0
    failovers: int = 0


@dataclass(frozen=True)
class EventLine:
    at: float  # wall-clock seconds
    cluster: str
    name: str
    summary: str


class ClusterState:
    """Folds decoded messages of any number of clusters into a view. No I/O, no threads.

    ``clock`` (monotonic seconds) dates heartbeats and arrivals; ``wall`` (epoch seconds) only labels
    events. ``cluster`` keeps one cluster and ignores the others.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_events: int = 12,
        wall: Callable[[], float] = time.time,
        cluster: str | None = None,
        title: str = "edgeagent monitor",
        show_left: bool = False,
    ) -> None:
        self.clock = clock
        self.wall = wall
        self.cluster = cluster
        self.title = title
        self.show_left = show_left
        self.devices: dict[tuple[str, str], DeviceView] = {}
        self.runs: dict[str, RunView] = {}
        self.events: deque[EventLine] = deque(maxlen=max(1, max_events))
        self.received = 0
        self.dropped = 0  # malformed payloads and topics outside the protocol
        self.ignored = 0  # well-formed messages the monitor does not show (data plane, other clusters)
        self._active: set[str] = set()  # clusters with a live device or any traffic beyond statuses

    # -- folding in ----------------------------------------------------------------------------

    def apply(self, topic: str, payload: bytes) -> None:
        """Fold one payload in. Anything malformed is counted in :attr:`dropped`; this never raises."""
        self.received += 1
        try:
            self._apply(topic, payload)
        except (ProtocolError, ValueError, TypeError, OverflowError) as exc:
            self.dropped += 1
            log.debug("monitor dropped a %d-byte message on %s: %s", len(payload), topic, exc)
        except Exception:  # a bug here must not kill paho's thread or the dashboard
            self.dropped += 1
            log.debug("monitor failed on a %d-byte message on %s", len(payload), topic, exc_info=True)

    def _apply(self, topic: str, payload: bytes) -> None:
        cluster, info = parse_topic(topic)
        if self.cluster is not None and cluster != self.cluster:
            self.ignored += 1
            return
        if info.family is Family.STATUS and not payload:
            # An empty retained message clears the device's status: forget the device.
            assert info.device is not None
            self.devices.pop((cluster, info.device), None)
            return
        wanted = info.family in SHOWN_FAMILIES or info.family in SHOWN_FIXED
        if not wanted or (info.family is Family.REPLY and payload[:1] != b"{"):
            self.ignored += 1  # the data plane and CBOR replies (ready, weights): not decoded at all
            return
        sender, message = decode(payload, open_values=True)
        now = self.clock()
        if info.device is not None:
            self._device_message(cluster, info.device, message, now)
        elif isinstance(message, Event):
            self._event(cluster, sender, message)
        else:
            self.ignored += 1

    def _device(self, cluster: str, device_id: str, now: float) -> DeviceView:
        key = (cluster, device_id)
        device = self.devices.get(key)
        if device is None:
            device = self.devices[key] = DeviceView(device_id=device_id, cluster=cluster)
        device.last_seen = now
        return device

    def _device_message(self, cluster: str, device_id: str, message: Message, now: float) -> None:
        if isinstance(message, Status):
            known = (cluster, device_id) in self.devices
            device = self._device(cluster, device_id, now)
            if message.state != "left":
                device.left_at = None
            elif device.state != "left":
                # Seen leaving: shown for a while. A retained "left" of a device we never saw alive left
                # before we looked: hidden at once.
                device.left_at = now if known and device.state not in GONE_STATES else None
            device.state, device.stage, device.detail = message.state, message.stage, message.detail
            device.run_id = message.run_id or device.run_id
            if message.state not in GONE_STATES:
                self._active.add(cluster)
            self._note_run_id(cluster, message.run_id)
        elif isinstance(message, Heartbeat):
            device = self._device(cluster, device_id, now)
            device.last_heartbeat = now
            if message.interval > 0:
                device.heartbeat_interval = message.interval
            device.stage = message.stage
            device.run_id = message.run_id or device.run_id
            self._active.add(cluster)
        elif isinstance(message, Metrics):
            device = self._device(cluster, device_id, now)
            device.metrics = dict(message.values)
            stage = _int(device.metrics, "stage")
            if stage is not None:
                device.stage = stage
            device.run_id = message.run_id or device.run_id
            self._active.add(cluster)
            self._central_metrics(cluster, device_id, message)
        elif isinstance(message, Announce):
            device = self._device(cluster, device_id, now)
            device.slowdown = message.slowdown
            device.state = device.state or "online"
            self._active.add(cluster)
        elif isinstance(message, ErrorReport):
            device = self._device(cluster, device_id, now)
            device.detail = f"{message.code}: {message.reason}"
            self._active.add(cluster)
            self._add_event(cluster, "error", f"{device_id} [{message.code}]: {_clip(message.reason, 90)}")
        else:
            self.ignored += 1

    def _run(self, cluster: str, run_id: str = "") -> RunView:
        run = self.runs.get(cluster)
        if run is None or (run_id and run.run_id and run_id != run.run_id):
            run = self.runs[cluster] = RunView(run_id=run_id)  # a new run starts from scratch
        run.run_id = run.run_id or run_id
        return run

    def _note_run_id(self, cluster: str, run_id: str) -> None:
        # Statuses only name the run when nothing better (events, central metrics) has.
        if run_id and (cluster not in self.runs or not self.runs[cluster].run_id):
            self._run(cluster, run_id)

    def _central_metrics(self, cluster: str, device_id: str, message: Metrics) -> None:
        values = message.values
        points, workers = _ints(values.get("points")), _strs(values.get("workers"))
        accuracy = _num(values, "accuracy")
        if not points and not workers and accuracy is None:
            return  # a worker's metrics
        run = self._run(cluster, message.run_id)
        run.central = run.central or device_id
        if points:
            run.points = points
        if workers:
            run.workers = workers
        groups = _groups(values.get("groups"))
        if groups:
            run.groups = groups
        if accuracy is not None:
            run.running_accuracy = accuracy

    def _event(self, cluster: str, sender: str, event: Event) -> None:
        self._active.add(cluster)
        details = event.details
        run = self._run(cluster, event.run_id)
        run.central = run.central or sender
        if event.name in ("partition", "recovery"):
            points, workers = _ints(details.get("points")), _strs(details.get("workers"))
            if points:
                run.points = points
                run.workers = workers
                run.groups = _groups(details.get("groups"))
            plan = _int(details, "plan_id")
            if plan is not None:
                run.plan_id = plan
            if event.name == "recovery":
                run.recoveries += 1
        elif event.name == "failover":
            run.failovers += 1
            groups = _groups(details.get("groups"))
            if groups:
                run.groups = groups
        elif event.name == "epoch":
            run.epoch = _int(details, "epoch")
            run.accuracy = _num(details, "accuracy")
            run.loss = _num(details, "loss")
        self._add_event(cluster, event.name, summarize(event.name, details))

    def _add_event(self, cluster: str, name: str, summary: str) -> None:
        self.events.appendleft(EventLine(self.wall(), cluster, name, summary))

    # -- what to show ----------------------------------------------------------------------------

    @staticmethod
    def left_long_ago(d: DeviceView, now: float) -> bool:
        """``d`` has left and is no longer listed (its grace is over, or it left before we looked)."""
        return d.state == "left" and (d.left_at is None or now - d.left_at >= LEFT_GRACE)

    def live(self, now: float) -> set[str]:
        """Active clusters, less the finished ones: every device has left (a crash keeps it shown)."""
        finished = {cluster for cluster, _ in self.devices}
        for d in self.devices.values():
            if not self.left_long_ago(d, now):
                finished.discard(d.cluster)
        return self._active - finished

    def stages_seen(self, cluster: str) -> int:
        stages = {d.stage for d in self.devices.values() if d.cluster == cluster and d.stage >= 0}
        return len(stages)


def _groups(value: Any) -> list[list[str]]:
    """Every stage's devices from a message (a list of lists of ids), or [] if it is not one."""
    if not isinstance(value, list) or not all(isinstance(g, list) for g in value):
        return []
    return [_strs(g) for g in value]
