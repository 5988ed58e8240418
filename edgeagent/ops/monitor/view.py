"""How the monitor shows what it knows: a :class:`~.state.ClusterState` drawn with rich.

A header, the devices table (devices that left dimmed, late heartbeats in red), a footer counting what
is hidden, the run panel (split, accuracy, recoveries) and the latest events; the run and events panels
sit side by side on a console at least :data:`WIDE` columns wide.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from edgeagent.ops.monitor.state import GONE_STATES, ClusterState, DeviceView, EventLine, RunView
from edgeagent.ops.monitor.values import _int, _num

if TYPE_CHECKING:
    from collections import deque

MISSED_HEARTBEATS = 3  # a heartbeat older than this many intervals is shown in red
WIDE = 120  # from this console width on, the run and events panels sit side by side

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
    "failover": "yellow",
    "join": "blue",
    "compression": "magenta",
    "error": "red",
}
_DASH = "—"


def render(state: ClusterState) -> RenderableType:
    """The whole screen now, by the state's own clocks: a header, the devices table, the run panel and
    recent events."""
    return screen(state, now=state.clock(), wall=state.wall())


def screen(state: ClusterState, *, now: float, wall: float) -> RenderableType:
    """The whole screen at monotonic second ``now`` (heartbeat ages) and epoch second ``wall``."""
    clusters = {c for c, _ in state.devices} | set(state.runs) | {e.cluster for e in state.events}
    show_all = state.cluster is not None
    live = state.live(now)
    present = [d for d in state.devices.values() if state.show_left or not state.left_long_ago(d, now)]
    left = len(state.devices) - len(present)
    shown = [d for d in present if show_all or d.cluster in live]
    hidden = len(present) - len(shown)
    dormant = len({d.cluster for d in present} - live) if not show_all else 0
    header = Text.assemble(
        (state.title, "bold"),
        f"  ·  {len(clusters)} cluster{_s(len(clusters))}",
        f"  ·  {len(shown)} device{_s(len(shown))}",
        f"  ·  {state.received} messages",
        (f"  ·  {state.dropped} dropped", "red" if state.dropped else "dim"),
        (f"  ·  updated {time.strftime('%H:%M:%S', time.localtime(wall))}", "dim"),
    )
    devices = _devices_table(shown, now)
    notes = []
    if hidden:
        notes.append(
            f"{hidden} offline device{_s(hidden)} of {dormant} dormant cluster{_s(dormant)} hidden "
            "(retained statuses of past runs; --cluster NAME shows them)"
        )
    if left:
        notes.append(f"{left} device{_s(left)} that left hidden (--show-left shows them)")
    footer: RenderableType = Text("\n".join(notes), style="dim") if notes else ""
    run = _run_panel(state, live)
    return _Screen(header, devices, footer, run, _events_panel(state.events, len(clusters) > 1))


def _devices_table(devices: Iterable[DeviceView], now: float) -> Table:
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
            _heartbeat(d, now),
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


def _run_panel(state: ClusterState, live: set[str]) -> Panel:
    blocks: list[RenderableType] = []
    for cluster in sorted(state.runs):
        if state.cluster is None and cluster not in live:
            continue
        run = state.runs[cluster]
        stages = len(run.points) - 1 if len(run.points) > 1 else state.stages_seen(cluster)
        head = Text.assemble(
            (cluster, "bold"),
            "  run ",
            (run.run_id or "?", "bold cyan"),
            f"  ·  {stages} stage{_s(stages)}" if stages else "",
            f"  ·  plan {run.plan_id}" if run.plan_id is not None else "",
            (f"  ·  {run.recoveries} recover{'ies' if run.recoveries != 1 else 'y'}", "yellow")
            if run.recoveries
            else "",
            (f"  ·  {run.failovers} failover{_s(run.failovers)}", "yellow") if run.failovers else "",
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


def _events_panel(events: deque[EventLine], with_cluster: bool) -> Panel:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="dim", no_wrap=True)
    if with_cluster:
        grid.add_column(no_wrap=True)
    grid.add_column()
    for e in events:
        stamp = time.strftime("%H:%M:%S", time.localtime(e.at))
        line = Text(e.summary, style=EVENT_STYLES.get(e.name, ""))
        grid.add_row(*((stamp, e.cluster, line) if with_cluster else (stamp, line)))
    body: RenderableType = grid if events else Text("no events yet", style="dim")
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


def _owners(run: RunView) -> list[str]:
    """The device of each stage; the worker list may include the central node (index 0) or not."""
    stages = len(run.points) - 1
    if len(run.groups) == stages:  # hybrid stages: a replicated stage lists its devices
        return [" + ".join(g) + (f"  (x{len(g)})" if len(g) > 1 else "") for g in run.groups]
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


def _s(n: int) -> str:
    return "" if n == 1 else "s"
