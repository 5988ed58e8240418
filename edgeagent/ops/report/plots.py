"""PNG plots of a run report, written beside the JSON.

``report.json`` gives ``report-loss.png`` (training loss and test accuracy over training time),
``report-throughput.png`` (samples/s over training time), ``report-partition.png`` (layers per stage
against batch id), ``report-devices.png`` (each device's compute, communication and idle seconds, when the
report has its devices) and, only when the run had recoveries, ``report-faults.png`` (seconds per batch
around each fault). A plot with nothing to show carries a note saying so. A mode may draw one plot of its
own from its section of the report (split-federated runs' ``report-splitfed.png``, allreduce runs'
``report-allreduce.png``): its registry entry names it (:func:`mode_plot`), and it draws with
:mod:`.style`.

Drawing goes through matplotlib's object API and its Agg canvas (no pyplot, no display, no global state);
matplotlib is imported only when a plot is drawn.
"""

from __future__ import annotations

import importlib
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeagent.mode_names import MODES
from edgeagent.ops.report.derived import (
    _bar_segments,
    _batch_size,
    _epoch_ends,
    _per_batch,
    _rolling_mean,
    _split_at_faults,
    _throughput,
)
from edgeagent.ops.report.devices_plot import plot_devices  # every device's compute / communication / idle
from edgeagent.ops.report.parse import (
    _int,
    _numbers,
    _recoveries,
    _Recovery,
    _Split,
    _splits,
    _Step,
    _timeline,
    finite,
)
from edgeagent.ops.report.style import (
    ACCURACY_COLOR,
    DEVICE_COLORS,
    LOSS_COLOR,
    PARTITION_COLOR,
    RECOVERY_COLOR,
    RESUME_COLOR,
    empty_note,
    legend_below,
    new_figure,
    plot_title,
    save_png,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

THROUGHPUT_WINDOW = 10  # batches per samples/s window
FAULT_SPAN = 15  # batches shown either side of a fault
MAX_FAULT_PANELS = 6

SEGMENT_COLORS = {
    "lost": "#c7c7c7",
    "detect": "#ff9896",
    "recover": RECOVERY_COLOR,
    "after": "#1f77b4",
}
SEGMENT_LABELS = {
    "lost": "work lost at the fault (replayed later)",
    "detect": "fault → detection",
    "recover": "detection → resume (recovery)",
    "after": "resume → this batch done",
}


def _seconds(x: float) -> str:
    return f"{x:.2f} s" if x >= 0.1 else f"{1e3 * x:.0f} ms" if x >= 1e-3 else f"{1e3 * x:.2f} ms"


def _mark_events(
    ax: Axes, recoveries: Sequence[_Recovery], splits: Sequence[_Split]
) -> tuple[list[Any], list[str]]:
    """Recoveries (shaded from the last progress to the resume, solid line at detection) and re-partitions
    (dotted lines) on a time axis; returns legend handles."""
    handles: list[Any] = []
    labels: list[str] = []
    for r in recoveries:
        if r.central:
            continue
        start = r.last_progress if r.last_progress is not None else r.detected
        if start is not None and r.resumed is not None and r.resumed > start:
            span = ax.axvspan(start, r.resumed, color=RECOVERY_COLOR, alpha=0.12, lw=0)
            if "recovery (stalled → resumed)" not in labels:
                handles.append(span)
                labels.append("recovery (stalled → resumed)")
        if r.detected is not None:
            line = ax.axvline(r.detected, color=RECOVERY_COLOR, lw=1.4)
            if "fault detected" not in labels:
                handles.append(line)
                labels.append("fault detected")
    for s in splits:
        if s.initial or s.recovery or s.t is None:
            continue
        line = ax.axvline(s.t, color=PARTITION_COLOR, lw=1.1, ls=":")
        if "re-partition" not in labels:
            handles.append(line)
            labels.append("re-partition")
    return handles, labels


# -- the plots ------------------------------------------------------------------------------------------


def _plot_loss(
    report: Mapping[str, Any],
    steps: Sequence[_Step],
    recoveries: Sequence[_Recovery],
    splits: Sequence[_Split],
    path: Path,
) -> Path:
    fig = new_figure(9.0, 5.0)
    ax = fig.add_subplot()
    ax.set_title(plot_title(report, "Training loss and test accuracy"), fontsize=11)
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel("loss (cross-entropy)")
    ax.grid(True, alpha=0.3)
    handles: list[Any] = []
    labels: list[str] = []

    points = [(s.t, s.loss) for s in steps if s.loss is not None]
    if points:
        window = min(50, max(3, len(points) // 20))
        raw = ax.scatter(
            [p[0] for p in points], [p[1] for p in points], s=5, color=LOSS_COLOR, alpha=0.3, lw=0
        )
        smooth = None
        for piece in _split_at_faults(points, recoveries):
            (smooth,) = ax.plot(
                [p[0] for p in piece], _rolling_mean([p[1] for p in piece], window), color=LOSS_COLOR, lw=1.8
            )
        handles += [raw, smooth]
        labels += ["training loss per batch", f"training loss, mean of {window} batches"]

    accuracy = _numbers(report, "test_accuracy_per_epoch")
    test_loss = _numbers(report, "test_loss_per_epoch")
    epochs = max(len(accuracy), len(test_loss))
    ends = _epoch_ends(report, steps, epochs)
    loss_marks = [(t, v) for t, v in zip(ends, test_loss, strict=False) if t is not None and v is not None]
    if loss_marks:
        (mark,) = ax.plot(
            [m[0] for m in loss_marks], [m[1] for m in loss_marks], "s--", color="#17becf", ms=5, lw=1
        )
        handles.append(mark)
        labels.append("test loss (end of epoch)")
    acc_marks = [
        (t, 100 * v) for t, v in zip(ends, accuracy, strict=False) if t is not None and v is not None
    ]
    if acc_marks:
        ax2 = ax.twinx()
        (acc,) = ax2.plot(
            [m[0] for m in acc_marks], [m[1] for m in acc_marks], "o-", color=ACCURACY_COLOR, ms=6, lw=1.5
        )
        ax2.set_ylim(0, 108)
        ax2.set_ylabel("test accuracy (%)", color=ACCURACY_COLOR)
        ax2.tick_params(axis="y", colors=ACCURACY_COLOR)
        handles.append(acc)
        labels.append(f"test accuracy (end of epoch; last {acc_marks[-1][1]:.1f}%)")
    if points or loss_marks:
        ax.set_ylim(bottom=0)
    event_handles, event_labels = _mark_events(ax, recoveries, splits)
    handles += event_handles
    labels += event_labels
    if not points and not acc_marks:
        empty_note(ax, "no batches recorded: the run stopped before its first batch finished")
    legend_below(ax, handles, labels)
    return save_png(fig, path)


def _plot_throughput(
    report: Mapping[str, Any],
    steps: Sequence[_Step],
    recoveries: Sequence[_Recovery],
    splits: Sequence[_Split],
    path: Path,
) -> Path:
    fig = new_figure(9.0, 4.6)
    ax = fig.add_subplot()
    ax.set_title(plot_title(report, "Training throughput"), fontsize=11)
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel("samples/s")
    ax.grid(True, alpha=0.3)
    size = _batch_size(report)
    series = _throughput(steps, recoveries, size, THROUGHPUT_WINDOW)
    handles: list[Any] = []
    labels: list[str] = []
    if series:
        few = sum(len(xs) for xs, _ in series) < 3
        for xs, ys in series:
            (line,) = ax.plot(
                xs, ys, color=LOSS_COLOR, lw=1.5, marker="o" if few or len(xs) == 1 else None, ms=4
            )
        handles.append(line)
        labels.append(f"samples/s over the last {THROUGHPUT_WINDOW} batches ({size} samples each)")
        mean = finite(report.get("samples_per_second"))
        if mean is None and steps and steps[-1].t > 0:
            mean = size * len(steps) / steps[-1].t
        if mean:
            avg = ax.axhline(mean, color="#7f7f7f", lw=1, ls="--")
            handles.append(avg)
            labels.append(f"run average: {mean:.0f} samples/s")
        peak = max(max(ys) for _, ys in series)
        ax.set_ylim(bottom=0, top=peak * 1.1 if peak > 0 else 1.0)
    else:
        empty_note(ax, "no batches recorded: the run stopped before its first batch finished")
    event_handles, event_labels = _mark_events(ax, recoveries, splits)
    legend_below(ax, handles + event_handles, labels + event_labels, ncol=3)
    return save_png(fig, path)


def _device_colors(splits: Sequence[_Split]) -> dict[str, str]:
    colors: dict[str, str] = {}
    for s in splits:
        for name in s.names:
            if name not in colors:
                colors[name] = DEVICE_COLORS[len(colors) % len(DEVICE_COLORS)]
    return colors


def _stage_label(name: str, layers: int, width_in: float, height_in: float) -> str | None:
    """The text on a stage's box of ``width_in`` x ``height_in`` inches, or None when it does not fit."""
    count = f"{layers} layer{'s' if layers != 1 else ''}"
    text = f"{name}\n{count}" if height_in >= 0.34 else f"{name}: {count}"
    if height_in < 0.17 or width_in < 0.075 * max(len(line) for line in text.split("\n")) + 0.1:
        return None
    return text


def _draw_splits(
    ax: Axes, splits: Sequence[_Split], end: int, layers: int, colors: Mapping[str, str], fig: Figure
) -> None:
    """One box per stage and split (batch ids across, its layers up), labelled where the label fits."""
    from matplotlib.patches import Rectangle

    fig_w, fig_h = fig.get_size_inches()
    axes_w, axes_h = 0.8 * fig_w, 0.7 * fig_h  # about the axes' size, to decide which labels fit
    for i, s in enumerate(splits):
        # A split runs until the next one starts; a later one that starts earlier (a rollback) is drawn on
        # top, so each batch id shows the split its last (kept) pass used.
        stop = splits[i + 1].batch if i + 1 < len(splits) else end
        if stop <= s.batch:
            continue
        for k, name in enumerate(s.names):
            lo, hi = s.points[k], s.points[k + 1]
            if hi <= lo:
                continue
            ax.add_patch(
                Rectangle(
                    (s.batch, lo), stop - s.batch, hi - lo, facecolor=colors[name], edgecolor="white", lw=1
                )
            )
            text = _stage_label(name, hi - lo, axes_w * (stop - s.batch) / end, axes_h * (hi - lo) / layers)
            if text is None:
                continue
            ax.text(
                s.batch + (stop - s.batch) / 2,
                (lo + hi) / 2,
                text,
                ha="center",
                va="center",
                fontsize=7.5,
                color="white",
                fontweight="bold",
            )


def _mark_batches(
    ax: Axes, recoveries: Sequence[_Recovery], splits: Sequence[_Split]
) -> tuple[list[Any], list[str]]:
    """Faults (solid), re-partitions (dotted) and a central node's resume (dashed) on a batch-id axis;
    returns legend handles."""
    handles: list[Any] = []
    labels: list[str] = []
    for r in recoveries:
        if r.central or r.batch is None:
            continue
        line = ax.axvline(r.batch, color=RECOVERY_COLOR, lw=1.6)
        if "fault (batch it hit)" not in labels:
            handles.append(line)
            labels.append("fault (batch it hit)")
    for s in splits:
        if s.initial or s.recovery:
            continue
        line = ax.axvline(s.batch, color="black", lw=1.1, ls=":")
        if "re-partition decided" not in labels:
            handles.append(line)
            labels.append("re-partition decided")
    for r in recoveries:
        if r.central and r.batch is not None:
            handles.append(ax.axvline(r.batch, color=RESUME_COLOR, lw=1.6, ls="--"))
            labels.append(f"central resumed from batch {r.batch}")
            break
    return handles, labels


def _plot_partition(
    report: Mapping[str, Any],
    steps: Sequence[_Step],
    recoveries: Sequence[_Recovery],
    splits: Sequence[_Split],
    path: Path,
) -> Path:
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    fig = new_figure(9.0, 4.8)
    ax = fig.add_subplot()
    ax.set_title(plot_title(report, "Layers per pipeline stage"), fontsize=11)
    ax.set_xlabel("batch id")
    ax.set_ylabel("layers (stacked in pipeline order)")
    if not splits:
        empty_note(ax, "no partition recorded")
        ax.set_yticks([])
        return save_png(fig, path)

    batches = _int(report.get("batches")) or 0
    end = max([batches, *(s.batch + 1 for s in steps), *(s.batch + 1 for s in splits)])
    layers = max(1, *(s.points[-1] for s in splits))
    colors = _device_colors(splits)
    _draw_splits(ax, splits, end, layers, colors, fig)
    handles: list[Any] = [Patch(facecolor=c, label=n) for n, c in colors.items()]
    labels = list(colors)
    mark_handles, mark_labels = _mark_batches(ax, recoveries, splits)
    ax.set_xlim(0, end)
    ax.set_ylim(0, layers)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if not all(s.named for s in splits):
        ax.set_title(
            plot_title(report, "Layers per pipeline stage")
            + "\n(worker names unknown for some splits: shown as stage numbers)",
            fontsize=11,
        )
    legend_below(ax, handles + mark_handles, labels + mark_labels, ncol=5)
    return save_png(fig, path)


def _recovery_title(n: int, r: _Recovery) -> str:
    if r.central:
        where = f"batch {r.batch}" if r.batch is not None else "a checkpoint"
        return f"Recovery {n}: the central node restarted and resumed from the checkpoint of {where}"
    head = f"Recovery {n} (case {r.case})"
    if r.batch is not None:
        head += f": fault at batch {r.batch}"
    if r.lost:
        head += f", lost {', '.join(r.lost)}"
    parts = []
    if r.detected is not None and r.last_progress is not None:
        parts.append(f"detected {_seconds(r.detected - r.last_progress)} after the last progress")
    if r.resumed is not None and r.detected is not None:
        parts.append(f"resumed {_seconds(r.resumed - r.detected)} after detection")
    if r.rolled_back_to is not None and not r.rollback:
        replayed = f", {r.replayed} of its batches replayed on them alone" if r.replayed is not None else ""
        parts.append(
            f"no rollback: the dead stage's layers from their replica of batch {r.rolled_back_to}{replayed}"
        )
    elif r.rolled_back_to is not None:
        replayed = f", {r.replayed} replayed" if r.replayed is not None else ""
        parts.append(f"rolled back to batch {r.rolled_back_to}{replayed}")
    return "\n".join([head, *textwrap.wrap("; ".join(parts), 90)])


def _fault_panel(ax: Axes, side: Axes, r: _Recovery, per_batch: Mapping[int, tuple[float, float]]) -> None:
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    side.axis("off")
    if r.batch is None:
        empty_note(ax, "no batch recorded for this recovery")
        return
    lo = r.batch - FAULT_SPAN
    if r.rolled_back_to is not None:
        lo = min(lo, r.rolled_back_to - 3)  # show the batches replayed after the rollback too
    lo, hi = max(0, lo), r.batch + FAULT_SPAN
    ax.set_xlim(lo - 0.7, hi + 0.7)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ids = [b for b in range(lo, hi + 1) if b in per_batch]
    if not ids:
        empty_note(ax, "no batch timings around this fault in the timeline")
        return
    replay_lo = r.rolled_back_to if r.rolled_back_to is not None else r.batch
    kinds = {
        "before": ("before the fault", "#9ecae1"),
        "replay": ("replayed after the rollback", "#ffbb78"),
        "after": ("after the resume" if r.central else "after the fault", "#6baed6"),
    }
    used: list[str] = []
    split_bar: tuple[int, list[tuple[str, float, float]]] | None = None
    plain: list[float] = []
    for b in ids:
        prev, t = per_batch[b]
        segments = [] if r.central else _bar_segments(r, prev, t)
        if segments and split_bar is None:
            split_bar = (b, segments)
            for key, s_lo, s_hi in segments:
                ax.bar(b, s_hi - s_lo, bottom=s_lo - prev, width=0.8, color=SEGMENT_COLORS[key])
            continue
        kind = "before" if b < replay_lo else "replay" if not r.central and b <= r.batch else "after"
        ax.bar(b, t - prev, width=0.8, color=kinds[kind][1])
        plain.append(t - prev)
        if kind not in used:
            used.append(kind)
    tallest = max(t - prev for prev, t in (per_batch[b] for b in ids))
    top = tallest * 1.08
    if plain and tallest > 3 * max(plain):
        # One bar (the fault's) dwarfs the rest: clip the axis so the others stay readable, and write its
        # height on it; the panel on the right shows that bar whole.
        top = 1.35 * max(plain)
        for b in ids:
            prev, t = per_batch[b]
            if t - prev > top:
                ax.annotate(
                    _seconds(t - prev),
                    xy=(b, top),
                    xytext=(5, -3),
                    textcoords="offset points",
                    ha="left",
                    va="top",
                    fontsize=7,
                    bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "#999999", "lw": 0.5},
                )
    ax.set_ylim(0, top if top > 0 else 1.0)
    color = RESUME_COLOR if r.central else RECOVERY_COLOR
    fault = ax.axvline(r.batch, color=color, lw=1.3, ls="--", zorder=0)
    handles: list[Any] = [fault]
    labels = [f"central resumed at batch {r.batch}" if r.central else f"fault (batch {r.batch})"]
    order = ["before", "replay", "after"]
    for kind in sorted(used, key=order.index):
        handles.append(Patch(color=kinds[kind][1]))
        labels.append(kinds[kind][0])
    if split_bar is not None:
        b, segments = split_bar
        side.axis("on")
        base = per_batch[b][0]
        for key, s_lo, s_hi in segments:
            side.bar(0, s_hi - s_lo, bottom=s_lo - base, width=0.6, color=SEGMENT_COLORS[key])
            handles.append(Patch(color=SEGMENT_COLORS[key]))
            labels.append(f"{SEGMENT_LABELS[key]}: {_seconds(s_hi - s_lo)}")
        side.set_xlim(-0.6, 0.6)
        side.set_xticks([0], [f"batch {b}"])
        side.set_ylabel("seconds")
        side.set_title("the long bar, whole", fontsize=8)
        side.grid(True, axis="y", alpha=0.3)
        side.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.15, 1.0), frameon=False)
    else:
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _plot_faults(
    report: Mapping[str, Any], steps: Sequence[_Step], recoveries: Sequence[_Recovery], path: Path
) -> Path:
    shown = recoveries[:MAX_FAULT_PANELS]
    fig = new_figure(10.0, 0.4 + 3.6 * len(shown))
    grid = fig.add_gridspec(len(shown), 2, width_ratios=[6, 1])
    per_batch = _per_batch(steps)
    for n, r in enumerate(shown):
        ax, side = fig.add_subplot(grid[n, 0]), fig.add_subplot(grid[n, 1])
        ax.set_title(_recovery_title(n + 1, r), fontsize=9, loc="left")
        ax.set_xlabel("batch id")
        ax.set_ylabel("seconds per batch")
        ax.grid(True, axis="y", alpha=0.3)
        _fault_panel(ax, side, r, per_batch)
    if len(recoveries) > len(shown):
        fig.text(
            0.5, 0.0, f"{len(recoveries) - len(shown)} later recoveries not shown", ha="center", fontsize=8
        )
    return save_png(fig, path)


# -- entry points ---------------------------------------------------------------------------------------


def plot_paths(json_path: str | Path) -> dict[str, Path]:
    """Where :func:`write_plots` puts each plot: ``run.json`` -> ``run-loss.png`` and so on."""
    p = Path(json_path)
    stem = p.stem if p.suffix.lower() == ".json" else p.name
    return {kind: p.with_name(f"{stem}-{kind}.png") for kind in ("loss", "throughput", "partition", "faults")}


def write_plots(report: Mapping[str, Any], json_path: str | Path) -> list[Path]:
    """Write PNGs beside the JSON (``report.json`` -> ``report-loss.png``, ``report-throughput.png``,
    ``report-partition.png``, and ``report-faults.png`` only when there were recoveries); return their paths.

    The first three are always written (with a note when the run recorded nothing to draw); a missing or
    malformed field is treated as absent, so the report of an aborted run never raises here.
    """
    paths = plot_paths(json_path)
    paths["loss"].parent.mkdir(parents=True, exist_ok=True)
    steps = _timeline(report)
    recoveries = _recoveries(report)
    splits = _splits(report, steps, recoveries)
    written = [
        _plot_loss(report, steps, recoveries, splits, paths["loss"]),
        _plot_throughput(report, steps, recoveries, splits, paths["throughput"]),
        _plot_partition(report, steps, recoveries, splits, paths["partition"]),
    ]
    if recoveries:
        written.append(_plot_faults(report, steps, recoveries, paths["faults"]))
    else:
        paths["faults"].unlink(missing_ok=True)  # left by an earlier run that wrote the same report name
    devices = plot_devices(report, json_path)
    if devices is not None:
        written.append(devices)
    own = mode_plot(report.get("mode"))
    drawn = own(report, json_path) if own is not None else None
    if drawn is not None:
        written.append(drawn)
    return written


ModePlot = Callable[[Mapping[str, Any], "str | Path"], "Path | None"]


def mode_plot(mode: object) -> ModePlot | None:
    """The plot of a mode's own section of the report (``"module:function"`` in its registry entry,
    :data:`edgeagent.mode_names.MODES`, imported when first drawn), or None: the mode has none, or the
    report names no mode this side knows."""
    entry = MODES.get(mode) if isinstance(mode, str) else None
    if entry is None or entry.plot is None:
        return None
    module, name = entry.plot.split(":")
    plot: ModePlot = getattr(importlib.import_module(module), name)
    return plot
