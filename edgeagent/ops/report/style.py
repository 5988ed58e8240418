"""The look every plot of a run report shares: its colours, its figure and canvas, its notes and legends.

:mod:`.plots` (the pipeline's loss, throughput, partition and fault plots) and each mode's own plot
(:mod:`edgeagent.modes.splitfed.plot`, :mod:`edgeagent.modes.allreduce.plot`) draw with these, so a fault
is the same red and a device the same colour in every PNG of a run. Drawing goes through matplotlib's
object API and its Agg canvas (no pyplot, no display, no global state); matplotlib is imported only when
a figure is made.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeagent.ops.files import write_atomic

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 150

RECOVERY_COLOR = "#d62728"
RESUME_COLOR = "#2ca02c"
PARTITION_COLOR = "#555555"
LOSS_COLOR = "#1f77b4"
ACCURACY_COLOR = "#ff7f0e"
# One colour per device (stage 0 = the central node first); tab10 without red (faults) and grey.
DEVICE_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]


def new_figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Figure, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=DPI, bbox_inches="tight", pad_inches=0.15, format="png")
    write_atomic(path, buffer.getvalue(), what="plot")  # whole or not at all, as the report
    return path


def empty_note(ax: Axes, text: str) -> None:
    """An empty panel saying why it is empty."""
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="#555555")


def plot_title(report: Mapping[str, Any], what: str) -> str:
    model, dataset = report.get("model"), report.get("dataset")
    if isinstance(model, str) and isinstance(dataset, str) and model and dataset:
        return f"{what}: {model} on {dataset}"
    return what


def legend_below(ax: Axes, handles: list[Any], labels: list[str], ncol: int = 3) -> None:
    if handles:
        ax.legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.16),
            ncol=min(ncol, len(handles)),
            fontsize=8,
            frameon=False,
        )
