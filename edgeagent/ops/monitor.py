"""``edgeagent monitor``: a live terminal dashboard of one cluster or of every cluster on a broker.

:class:`ClusterState` is pure: it folds the JSON messages a cluster publishes (statuses, heartbeats,
metrics, announcements, error reports and run events) into a view and renders that view with rich.
:func:`run_monitor` connects to the broker, feeds every payload into a ``ClusterState`` on paho's
network thread (under a lock) and redraws it with :class:`rich.live.Live` until Ctrl-C.

A device that shuts down cleanly publishes the retained state ``left``; that is not a problem, so such
a device never makes its cluster look alive and never shows a late heartbeat. A device seen leaving
while the monitor watches stays in the table, dimmed, for :data:`LEFT_GRACE` seconds and is then
hidden; one that had left before the monitor started (a retained ``left``) is hidden at once. The
footer counts them; ``show_left`` (``edgeagent monitor --show-left``) lists them all. A cluster all of
whose devices have left is finished: like a dormant one, its run panel is no longer shown.

The monitor subscribes only to the topics it shows, not to ``edgeagent/v1/+/#``: activations,
gradients and replicas are most of a run's traffic, and a dashboard should not double what the broker
sends on a slow link.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from edgeagent.errors import EdgeAgentError, ProtocolError
from edgeagent.protocol.messages import (
    Announce,
    ErrorReport,
    Event,
    Heartbeat,
    Message,
    Metrics,
    Status,
    decode,
)
from edgeagent.protocol.topics import PROTOCOL_VERSION, ROOT, Family, TopicInfo, Topics, check_name

if TYPE_CHECKING:
    from edgeagent.transport.mqtt import BrokerUrl, TlsOptions

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
MISSED_HEARTBEATS = 3  # a heartbeat older than this many intervals is shown in red
LEFT_GRACE = 30.0  # seconds a device seen leaving stays in the table before it is hidden
# States of a device that is not running and is not expected to: never shown as a live device.
GONE_STATES = ("offline", "left")
WIDE = 120  # from this console width on, the run and events panels sit side by side

# The families the monitor reads, all JSON. Everything else (the data plane) is not subscribed to.
SHOWN_FAMILIES = (Family.STATUS, Family.HEARTBEAT, Family.METRICS, Family.REPLY)
SHOWN_FIXED = (Family.ANNOUNCE, Family.EVENTS)

STATE_STYLES = {
    "training": "bold green",
    "online": "cyan",
    "idle": "yellow",
    "offline": "bold red",
    "error": "bold magenta",
    "left": "dim",
}
EVENT_STYLES = {
    "partition": "cyan",
    "epoch": "green",
    "slowdown": "yellow",
    "fault": "bold red",
    "recovery": "bold yellow",
    "join": "blue",
    "compression": "magenta",
    "error": "red",
}
_DASH = "—"


def subscriptions(cluster: str | None = None) -> list[str]:
    """The topic patterns the monitor subscribes to: one cluster, or every cluster (``+``)."""
    name = "+" if cluster is None else check_name("cluster", cluster)
    base = f"{ROOT}/{PROTOCOL_VERSION}/{name}"
    return [f"{base}/device/+/{f.value}" for f in SHOWN_FAMILIES] + [f"{base}/{f.value}" for f in SHOWN_FIXED]


# ---------------------------------------------------------------------------------------------
# State


@dataclass
class DeviceView:
    """What the monitor knows about one device of one cluster."""

    device_id: str
    cluster: str = "default"
    state: str = ""  # "" until a status arrives
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
    plan_id: int | None = None
    epoch: int | None = None
    accuracy: float | None = None  # of the latest epoch event
    loss: float | None = None
    running_accuracy: float | None = None  # the central node's metrics, between epochs
    recoveries: int = 0


@dataclass(frozen=True)
class EventLine:
    at: float  # wall-clock seconds
    cluster: str
    name: str
    summary: str


class ClusterState:
    """Folds decoded messages of any number of clusters into a view; renders it. No I/O, no threads.

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
        self._clock = clock
        self._wall = wall
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
        self._topics: dict[str, Topics] = {}

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
        cluster, info = self._parse(topic)
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
        sender, message = decode(payload)
        now = self._clock()
        if info.device is not None:
            self._device_message(cluster, info.device, message, now)
        elif isinstance(message, Event):
            self._event(cluster, sender, message)
        elif isinstance(message, Announce):
            device = self._device(cluster, message.device_id, now)
            device.slowdown = message.slowdown
            device.state = device.state or "online"
            self._active.add(cluster)
        else:
            self.ignored += 1

    def _parse(self, topic: str) -> tuple[str, TopicInfo]:
        parts = topic.split("/", 3)
        if len(parts) < 4 or parts[0] != ROOT or parts[1] != PROTOCOL_VERSION:
            raise ProtocolError(f"topic {topic!r} is not under {ROOT}/{PROTOCOL_VERSION}/<cluster>/")
        cluster = parts[2]
        topics = self._topics.get(cluster)
        if topics is None:
            topics = Topics(cluster)  # checks the name
            if len(self._topics) < 10_000:  # bounded even if someone sprays made-up clusters
                self._topics[cluster] = topics
        return cluster, topics.parse(topic)

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
            plan = _int(details, "plan_id")
            if plan is not None:
                run.plan_id = plan
            if event.name == "recovery":
                run.recoveries += 1
        elif event.name == "epoch":
            run.epoch = _int(details, "epoch")
            run.accuracy = _num(details, "accuracy")
            run.loss = _num(details, "loss")
        self._add_event(cluster, event.name, summarize(event.name, details))

    def _add_event(self, cluster: str, name: str, summary: str) -> None:
        self.events.appendleft(EventLine(self._wall(), cluster, name, summary))

    # -- rendering -----------------------------------------------------------------------------

    def render(self) -> RenderableType:
        """The whole screen: a header, the devices table, the run panel and recent events."""
        now = self._clock()
        clusters = {c for c, _ in self.devices} | set(self.runs) | {e.cluster for e in self.events}
        show_all = self.cluster is not None
        live = self._live(now)
        present = [d for d in self.devices.values() if self.show_left or not self._left_long_ago(d, now)]
        left = len(self.devices) - len(present)
        shown = [d for d in present if show_all or d.cluster in live]
        hidden = len(present) - len(shown)
        dormant = len({d.cluster for d in present} - live) if not show_all else 0
        header = Text.assemble(
            (self.title, "bold"),
            f"  ·  {len(clusters)} cluster{_s(len(clusters))}",
            f"  ·  {len(shown)} device{_s(len(shown))}",
            f"  ·  {self.received} messages",
            (f"  ·  {self.dropped} dropped", "red" if self.dropped else "dim"),
            (f"  ·  updated {time.strftime('%H:%M:%S', time.localtime(self._wall()))}", "dim"),
        )
        devices = self._devices_table(shown, now)
        notes = []
        if hidden:
            notes.append(
                f"{hidden} offline device{_s(hidden)} of {dormant} dormant cluster{_s(dormant)} hidden "
                "(retained statuses of past runs; --cluster NAME shows them)"
            )
        if left:
            notes.append(f"{left} device{_s(left)} that left hidden (--show-left shows them)")
        footer: RenderableType = Text("\n".join(notes), style="dim") if notes else ""
        return _Screen(header, devices, footer, self._run_panel(live), self._events_panel(len(clusters) > 1))

    @staticmethod
    def _left_long_ago(d: DeviceView, now: float) -> bool:
        return d.state == "left" and (d.left_at is None or now - d.left_at >= LEFT_GRACE)

    def _live(self, now: float) -> set[str]:
        """Active clusters, less the finished ones: every device has left (a crash keeps it shown)."""
        finished = {cluster for cluster, _ in self.devices}
        for d in self.devices.values():
            if not self._left_long_ago(d, now):
                finished.discard(d.cluster)
        return self._active - finished

    def _devices_table(self, devices: Iterable[DeviceView], now: float) -> Table:
        table = Table(title="devices", title_justify="left", title_style="bold", expand=True)
        table.add_column("device", style="bold", no_wrap=True)
        table.add_column("cluster", no_wrap=True)
        table.add_column("state", no_wrap=True)
        table.add_column("stage", justify="right")
        table.add_column("heartbeat", justify="right", no_wrap=True)
        table.add_column("batches", justify="right")
        table.add_column("samples/s", justify="right")
        table.add_column("compute/comm/idle %", justify="right", no_wrap=True)
        table.add_column("loss", justify="right")
        table.add_column("compress", justify="right")
        table.add_column("slowdown", justify="right")
        table.add_column("link Mb/s", justify="right")
        ordered = sorted(
            devices,
            key=lambda d: (
                d.state in GONE_STATES,
                d.cluster,
                d.stage if d.stage >= 0 else 1 << 30,
                d.device_id,
            ),
        )
        for d in ordered:
            m = d.metrics
            slowdown = _num(m, "slowdown")
            slowdown = d.slowdown if slowdown is None else slowdown
            table.add_row(
                d.device_id,
                d.cluster,
                Text(d.state or "?", style=STATE_STYLES.get(d.state, "dim")),
                str(d.stage) if d.stage >= 0 else _DASH,
                self._heartbeat(d, now),
                _fmt(_int(m, "batches"), "{:,}"),
                _fmt(_num(m, "samples_per_second"), "{:,.1f}"),
                _shares(m),
                _fmt(_num(m, "loss"), "{:.3f}"),
                _fmt(_num(m, "compression_ratio"), "{:.1f}x"),
                _fmt(slowdown, "{:.1f}x"),
                _fmt(_num(m, "link_mbps"), "{:.1f}") if _num(m, "link_mbps") else _DASH,
                style="dim" if d.state in GONE_STATES else None,
            )
        if not table.rows:
            table.add_row(Text("waiting for devices…", style="dim"), *[""] * (len(table.columns) - 1))
        return table

    @staticmethod
    def _heartbeat(d: DeviceView, now: float) -> Text:
        if d.state == "left":  # no more heartbeats: expected, not late
            return Text("left" if d.left_at is None else f"left {_age(now - d.left_at)}", style="dim")
        if d.last_heartbeat is None:
            if not d.last_seen:
                return Text(_DASH, style="dim")
            return Text(f"seen {_age(now - d.last_seen)}", style="dim")
        age = now - d.last_heartbeat
        late = age > MISSED_HEARTBEATS * d.heartbeat_interval
        return Text(_age(age), style="bold red" if late else "green")

    def _run_panel(self, live: set[str]) -> Panel:
        blocks: list[RenderableType] = []
        for cluster in sorted(self.runs):
            if self.cluster is None and cluster not in live:
                continue
            run = self.runs[cluster]
            stages = len(run.points) - 1 if len(run.points) > 1 else self._stages_seen(cluster)
            head = Text.assemble(
                (cluster, "bold"),
                "  run ",
                (run.run_id or "?", "bold cyan"),
                f"  ·  {stages} stage{_s(stages)}" if stages else "",
                f"  ·  plan {run.plan_id}" if run.plan_id is not None else "",
                (f"  ·  {run.recoveries} recover{'ies' if run.recoveries != 1 else 'y'}", "yellow")
                if run.recoveries
                else "",
            )
            if run.accuracy is not None:
                loss = f" (loss {run.loss:.3f})" if run.loss is not None else ""
                head.append(f"\naccuracy {100 * run.accuracy:.1f}% after epoch {run.epoch}{loss}", "green")
            elif run.running_accuracy is not None:
                head.append(f"\naccuracy {100 * run.running_accuracy:.1f}% (training, no epoch yet)")
            blocks.append(head)
            if len(run.points) > 1:
                split = Table.grid(padding=(0, 2))
                for _ in range(3):
                    split.add_column(no_wrap=True)
                owners = _owners(run)
                for k in range(len(run.points) - 1):
                    split.add_row(
                        f"stage {k}", f"layers [{run.points[k]}, {run.points[k + 1]})", owners[k] or "?"
                    )
                blocks.append(split)
            blocks.append("")
        if not blocks:
            blocks.append(Text("no run seen yet", style="dim"))
        else:
            blocks.pop()
        return Panel(Group(*blocks), title="run", title_align="left", border_style="cyan")

    def _stages_seen(self, cluster: str) -> int:
        stages = {d.stage for d in self.devices.values() if d.cluster == cluster and d.stage >= 0}
        return len(stages)

    def _events_panel(self, with_cluster: bool) -> Panel:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        if with_cluster:
            grid.add_column(no_wrap=True)
        grid.add_column()
        for e in self.events:
            stamp = time.strftime("%H:%M:%S", time.localtime(e.at))
            line = Text(e.summary, style=EVENT_STYLES.get(e.name, ""))
            grid.add_row(*((stamp, e.cluster, line) if with_cluster else (stamp, line)))
        body: RenderableType = grid if self.events else Text("no events yet", style="dim")
        return Panel(body, title="events (newest first)", title_align="left", border_style="magenta")


class _Screen:
    """Lays the parts out for the console's width: run and events side by side when there is room."""

    def __init__(
        self, header: Text, devices: Table, footer: RenderableType, run: Panel, events: Panel
    ) -> None:
        self.header, self.devices, self.footer, self.run, self.events = header, devices, footer, run, events

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.header
        yield self.devices
        if self.footer:
            yield self.footer
        if options.max_width >= WIDE:
            grid = Table.grid(expand=True, padding=(0, 1))
            grid.add_column(ratio=1)
            grid.add_column(ratio=1)
            grid.add_row(self.run, self.events)
            yield grid
        else:
            yield self.run
            yield self.events


# ---------------------------------------------------------------------------------------------
# Event summaries


def summarize(name: str, details: Mapping[str, Any]) -> str:
    """One short line for a run event, e.g. ``recovery case 3: lost worker-1, rolled back to 200``."""
    try:
        text = _summary(name, details)
    except Exception:  # details come from the network: never let a surprise break the screen
        text = None
    return _clip(text if text is not None else _generic(name, details), 110)


def _summary(name: str, d: Mapping[str, Any]) -> str | None:
    batch = _int(d, "batch")
    at = f" at batch {batch}" if batch is not None else ""
    if name == "partition":
        workers = _strs(d.get("workers"))
        on = f" on {', '.join(workers)}" if workers else ""
        return f"partition {_ints(d.get('points'))}{at}{on}"
    if name == "epoch":
        acc, loss = _num(d, "accuracy"), _num(d, "loss")
        text = f"epoch {_int(d, 'epoch')}: " + (f"{100 * acc:.1f}%" if acc is not None else "?")
        return text + (f", loss {loss:.3f}" if loss is not None else "")
    if name == "slowdown":
        factor = _num(d, "slowdown")
        return f"slowdown {d.get('device', '?')} {factor:.1f}x{at}" if factor is not None else None
    if name == "fault":
        devices = ", ".join(_strs(d.get("devices"))) or "?"
        reason = d.get("reason")
        return f"fault{at}: {devices}" + (f" ({reason})" if isinstance(reason, str) and reason else "")
    if name == "recovery":
        lost = ", ".join(_strs(d.get("lost"))) or "nothing"
        text = f"recovery case {d.get('case', '?')}: lost {lost}"
        restarted = _strs(d.get("restarted"))
        if restarted:
            text += f", restarted {', '.join(restarted)}"
        back = _int(d, "rolled_back_to")
        return text + (f", rolled back to {back}" if back is not None else "")
    if name == "join":
        return f"join {d.get('device', '?')}{at}"
    if name == "compression":
        epoch = _int(d, "epoch")
        when = f" (epoch {epoch})" if epoch is not None else ""
        return f"compression forward {_bits(d.get('forward'))}, backward {_bits(d.get('backward'))}{when}"
    return None


def _generic(name: str, details: Mapping[str, Any]) -> str:
    pairs = ", ".join(f"{k}={v}" for k, v in list(details.items())[:6])
    return f"{name} {pairs}".rstrip()


def _bits(value: Any) -> str:
    if isinstance(value, dict):
        value = [value[k] for k in sorted(value, key=lambda k: int(k) if str(k).isdigit() else 0)]
    if isinstance(value, list):
        return "[" + ", ".join("off" if not isinstance(b, int) or b >= 32 else str(b) for b in value) + "]"
    return str(value)


# ---------------------------------------------------------------------------------------------
# Small helpers (values come from the network: check every type)


def _num(values: Mapping[str, Any], key: str) -> float | None:
    v = values.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        number = float(v)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _int(values: Mapping[str, Any], key: str) -> int | None:
    v = values.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _ints(value: Any) -> list[int]:
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]


def _strs(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _owners(run: RunView) -> list[str]:
    """The device of each stage; the worker list may include the central node (index 0) or not."""
    stages = len(run.points) - 1
    workers = list(run.workers)
    if len(workers) == stages - 1 and run.central:
        workers = [run.central, *workers]
    return (workers + [""] * stages)[:stages]


def _shares(m: Mapping[str, Any]) -> str:
    wall = _num(m, "wall_s")
    if not wall or wall <= 0:
        return _DASH
    parts = [_num(m, k) for k in ("compute_s", "communication_s", "idle_s")]
    return " / ".join(_DASH if p is None else f"{100 * p / wall:.0f}" for p in parts)


def _fmt(value: float | None, spec: str) -> str:
    return _DASH if value is None else spec.format(value)


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.0f} h ago"


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _s(n: int) -> str:
    return "" if n == 1 else "s"


# ---------------------------------------------------------------------------------------------
# The live dashboard


def run_monitor(
    *,
    broker: str | BrokerUrl,
    cluster: str | None = None,
    refresh: float = 0.5,
    duration: float | None = None,
    console: Console | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
    tls: TlsOptions | None = None,
    show_left: bool = False,
) -> None:
    """Show the cluster(s) on ``broker`` until Ctrl-C (or for ``duration`` seconds).

    Raises :class:`~edgeagent.errors.EdgeAgentError` when the broker cannot be reached within
    ``connect_timeout``, :class:`~edgeagent.errors.ConfigError` for a malformed broker URL and
    :class:`~edgeagent.errors.ProtocolError` for an invalid cluster name.
    """
    from edgeagent.ops.logs import console as default_console
    from edgeagent.transport.mqtt import BrokerUrl, MqttTransport

    if not refresh > 0:
        raise ValueError(f"refresh must be > 0 seconds, got {refresh}")
    patterns = subscriptions(cluster)  # checks the cluster name
    url = broker if isinstance(broker, BrokerUrl) else BrokerUrl.parse(broker)
    out = console or default_console
    state = ClusterState(
        cluster=cluster,
        title=f"edgeagent monitor  ·  {url.redacted()}  ·  cluster {cluster or 'all'}",
        show_left=show_left,
    )
    lock = threading.Lock()

    def on_payload(topic: str, payload: bytes) -> None:
        with lock:
            state.apply(topic, payload)

    def screen() -> RenderableType:
        with lock:
            return state.render()

    transport = MqttTransport(url, f"ea-monitor-{secrets.token_hex(4)}", tls=tls)
    try:
        for pattern in patterns:
            transport.subscribe(pattern, on_payload)
        with out.status(f"connecting to {url.redacted()}…"):
            connected = transport.wait_connected(connect_timeout)
        if not connected:
            raise EdgeAgentError(
                f"cannot reach the MQTT broker at {url.redacted()} within {connect_timeout:g} s. "
                "Is it running (`edgeagent broker` starts one), and is --broker right?"
            )
        deadline = None if duration is None else time.monotonic() + duration
        with Live(get_renderable=screen, console=out, refresh_per_second=1 / refresh):
            while deadline is None or time.monotonic() < deadline:
                time.sleep(0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic())))
    except KeyboardInterrupt:
        pass
    finally:
        transport.close()
