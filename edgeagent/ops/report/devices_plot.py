"""Where each device's time went (the pipeline bubble): ``report-devices.png`` from the report's ``devices``.

One stacked bar per device (stage 0 first): compute, communication (encoding and publishing) and idle
(waiting for a message), in seconds of its run, with the payload bytes it sent and took in under its name.
When the report has stage times both predicted and measured (the pipeline with the latency predictor), a
second panel sets them side by side. Written only when the report holds device rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeagent.ops.report.parse import _int, _list, finite
from edgeagent.ops.report.style import (
    ACCURACY_COLOR,
    LOSS_COLOR,
    legend_below,
    new_figure,
    plot_title,
    save_png,
)

PARTS = (
    ("compute_s", "compute", "#2ca02c"),
    ("communication_s", "communication (encode, publish)", LOSS_COLOR),
    ("idle_s", "idle (waiting for a message)", "#c7c7c7"),
)


@dataclass(frozen=True)
class _Device:
    name: str
    stage: int | None
    seconds: dict[str, float]  # the PARTS keys it reported
    sent: int | None
    received: int | None
    predicted: float | None
    measured: float | None


def _devices(report: Mapping[str, Any]) -> list[_Device]:
    out: list[_Device] = []
    for row in _list(report, "devices"):
        if not isinstance(row, Mapping) or not isinstance(row.get("device"), str):
            continue
        seconds = {key: x for key, _, _ in PARTS if (x := finite(row.get(key))) is not None and x >= 0}
        if not seconds:
            continue
        out.append(
            _Device(
                name=row["device"],
                stage=_int(row.get("stage")),
                seconds=seconds,
                sent=_int(row.get("bytes_sent")),
                received=_int(row.get("bytes_received")),
                predicted=finite(row.get("predicted_stage_s")),
                measured=finite(row.get("measured_stage_s")),
            )
        )
    return out


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _label(d: _Device) -> str:
    head = d.name if d.stage is None else f"{d.name}\n(stage {d.stage})"
    if d.sent is None and d.received is None:
        return head
    sent = _size(d.sent) if d.sent is not None else "?"
    received = _size(d.received) if d.received is not None else "?"
    return f"{head}\n↑{sent} ↓{received}"


def devices_path(json_path: str | Path) -> Path:
    p = Path(json_path)
    stem = p.stem if p.suffix.lower() == ".json" else p.name
    return p.with_name(f"{stem}-devices.png")


def plot_devices(report: Mapping[str, Any], json_path: str | Path) -> Path | None:
    """Write ``report-devices.png`` beside the JSON when the report has device rows; else remove a stale one
    and return None."""
    path = devices_path(json_path)
    devices = _devices(report)
    if not devices:
        path.unlink(missing_ok=True)
        return None
    compared = [d for d in devices if d.predicted is not None and d.measured is not None]
    fig = new_figure(9.0 if not compared else 12.0, 4.8)
    grid = fig.add_gridspec(1, 2 if compared else 1, width_ratios=[3, 2] if compared else [1])
    ax = fig.add_subplot(grid[0, 0])
    ax.set_title(plot_title(report, "Where each device's time went"), fontsize=11)
    ax.set_ylabel("seconds of its run")
    ax.grid(True, axis="y", alpha=0.3)
    xs = list(range(len(devices)))
    bottoms = [0.0] * len(devices)
    handles: list[Any] = []
    labels: list[str] = []
    for key, label, color in PARTS:
        heights = [d.seconds.get(key, 0.0) for d in devices]
        bars = ax.bar(xs, heights, bottom=bottoms, width=0.6, color=color)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        handles.append(bars)
        labels.append(label)
    for x, d, top in zip(xs, devices, bottoms, strict=True):
        busy = d.seconds.get("compute_s", 0.0)
        if top > 0:
            ax.text(x, top, f"{100 * busy / top:.0f} % compute", ha="center", va="bottom", fontsize=7.5)
    ax.set_xticks(xs, [_label(d) for d in devices], fontsize=8)
    ax.set_ylim(0, max(bottoms) * 1.12 if max(bottoms) > 0 else 1.0)
    legend_below(ax, handles, labels, ncol=3)
    if compared:
        _compare_panel(fig.add_subplot(grid[0, 1]), compared)
    return save_png(fig, path)


def _compare_panel(ax: Any, devices: list[_Device]) -> None:
    xs = list(range(len(devices)))
    width = 0.38
    predicted = ax.bar(
        [x - width / 2 for x in xs],
        [1e3 * (d.predicted or 0.0) for d in devices],
        width,
        color=ACCURACY_COLOR,
    )
    measured = ax.bar(
        [x + width / 2 for x in xs], [1e3 * (d.measured or 0.0) for d in devices], width, color=LOSS_COLOR
    )
    ax.set_title("Stage time per batch", fontsize=10)
    ax.set_ylabel("ms")
    ax.set_xticks(xs, [d.name for d in devices], fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    legend_below(ax, [predicted, measured], ["predicted", "measured (in the pipeline)"], ncol=2)
