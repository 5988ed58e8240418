"""The split-federated run's plot (``report-splitfed.png``): where each epoch's time went, as PiPar's Fig. 6.

One group of bars per epoch: the server and every device, each bar its compute seconds with its idle
seconds stacked on top, labelled with the device's (P, N); a device left out of an epoch's FedAvg is
marked. Drawn in the style of :mod:`edgeagent.ops.report.style` (matplotlib's object API, Agg, imported
only when drawing); the registry entry names this plot, :mod:`edgeagent.ops.report.plots` draws it for a
split-federated report.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgeagent.ops.report.parse import finite
from edgeagent.ops.report.style import (
    DEVICE_COLORS,
    RECOVERY_COLOR,
    empty_note,
    legend_below,
    new_figure,
    plot_title,
    save_png,
)

IDLE_COLOR = "#c7c7c7"


def splitfed_path(json_path: str | Path) -> Path:
    p = Path(json_path)
    stem = p.stem if p.suffix.lower() == ".json" else p.name
    return p.with_name(f"{stem}-splitfed.png")


def _bars(epoch: Mapping[str, Any]) -> list[tuple[str, float, float, str]]:
    """(name, compute s, idle s, label) for the server and each device of one epoch."""
    devices = epoch.get("devices") if isinstance(epoch.get("devices"), Mapping) else {}
    assert isinstance(devices, Mapping)
    seconds = finite(epoch.get("seconds")) or 0.0
    server_idle = finite(epoch.get("server_idle_seconds")) or 0.0
    server_compute = sum(finite(d.get("server_compute_seconds")) or 0.0 for d in devices.values())
    bars = [("server", server_compute, min(server_idle, max(0.0, seconds - server_compute)), "")]
    for name, d in sorted(devices.items()):
        label = f"({d.get('split')},{d.get('parallel')})"
        bars.append(
            (str(name), finite(d.get("compute_seconds")) or 0.0, finite(d.get("idle_seconds")) or 0.0, label)
        )
    return bars


def plot_splitfed(report: Mapping[str, Any], json_path: str | Path) -> Path | None:
    """Write ``<report>-splitfed.png`` for a split-federated report; None (nothing written) for others."""
    section = report.get("splitfed")
    if report.get("mode") != "split-federated" or not isinstance(section, Mapping):
        return None
    epochs = [e for e in section.get("epochs", []) if isinstance(e, Mapping)]
    fig = new_figure(9.0, 4.8)
    ax = fig.add_subplot()
    path = splitfed_path(json_path)
    if not epochs:
        empty_note(ax, "no epoch finished")
        return save_png(fig, path)
    names = sorted({name for e in epochs for name, *_ in _bars(e)} - {"server"})
    order = ["server", *names]
    colors = {n: DEVICE_COLORS[i % len(DEVICE_COLORS)] for i, n in enumerate(order)}
    width = 0.8 / len(order)
    for x, epoch in enumerate(epochs):
        present = {name: (c, i, label) for name, c, i, label in _bars(epoch)}
        left_out = epoch.get("left_out") if isinstance(epoch.get("left_out"), Mapping) else {}
        for j, name in enumerate(order):
            pos = x - 0.4 + width * (j + 0.5)
            if name in present:
                compute, idle, label = present[name]
                ax.bar(pos, compute, width, color=colors[name])
                ax.bar(
                    pos, idle, width, bottom=compute, color=IDLE_COLOR, edgecolor=colors[name], linewidth=0.6
                )
                if label:
                    ax.text(pos, compute + idle, label, ha="center", va="bottom", fontsize=7)
            elif left_out and name in left_out:
                ax.text(pos, 0, "×", ha="center", va="bottom", fontsize=12, color=RECOVERY_COLOR)
    ax.set_xticks(range(len(epochs)), [f"epoch {e.get('epoch', i)}" for i, e in enumerate(epochs)])
    ax.set_ylabel("seconds (compute, then idle stacked)")
    ax.set_title(plot_title(report, "Split-federated: compute and idle time per epoch, (P, N) per device"))
    from matplotlib.patches import Patch

    handles = [Patch(color=colors[n]) for n in order] + [Patch(color=IDLE_COLOR), Patch(color=RECOVERY_COLOR)]
    labels = [*order, "idle", "× left out of FedAvg"]
    legend_below(ax, handles, labels, ncol=6)
    return save_png(fig, path)


__all__ = ["plot_splitfed", "splitfed_path"]
