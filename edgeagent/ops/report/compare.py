"""Two runs side by side: ``edgeagent report A.json --compare B.json``.

:func:`headline` reads a report's headline figures (pure); :func:`plot_compare` draws both runs on shared
axes, training loss and test accuracy over training time above, samples/s below, into
``A-vs-B.png`` beside ``A.json``. Reports are read as defensively as for :mod:`.plots`: a run that recorded
nothing shows a note, never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgeagent.ops.report.derived import _batch_size, _epoch_ends, _rolling_mean, _throughput
from edgeagent.ops.report.parse import _int, _numbers, _recoveries, _timeline, finite
from edgeagent.ops.report.style import empty_note, legend_below, new_figure, save_png

THROUGHPUT_WINDOW = 10  # batches per samples/s window, as report-throughput.png
RUN_COLORS = ("#1f77b4", "#d95f02")  # A, B: the same colour for a run's every line

# (key, heading, format) of the table printed beside the plot.
HEADLINE = (
    ("mode", "mode", "{}"),
    ("model", "model", "{}"),
    ("workers", "workers", "{}"),
    ("final_accuracy", "final accuracy", "{:.2%}"),
    ("samples_per_second", "samples/s", "{:.1f}"),
    ("train_seconds", "training s", "{:.1f}"),
    ("wall_seconds", "wall s", "{:.1f}"),
    ("batches", "batches", "{}"),
    ("epochs", "epochs", "{}"),
    ("recoveries", "recoveries", "{}"),
)


def headline(report: Mapping[str, Any]) -> dict[str, str]:
    """A report's headline figures as text (``-`` where it does not tell), keyed as :data:`HEADLINE`."""
    out: dict[str, str] = {}
    for key, _, fmt in HEADLINE:
        value = report.get(key)
        if key in ("workers", "recoveries"):
            value = len(value) if isinstance(value, list) else None
        elif key in ("batches", "epochs"):
            value = _int(value)
        elif key not in ("mode", "model"):
            value = finite(value)
        out[key] = "-" if value is None or value == "" else fmt.format(value)
    return out


def compare_table(a: Mapping[str, Any], b: Mapping[str, Any], names: tuple[str, str]) -> list[list[str]]:
    """Rows ``[heading, A's, B's]``, the first row the run names."""
    ha, hb = headline(a), headline(b)
    return [["", *names], *([heading, ha[key], hb[key]] for key, heading, _ in HEADLINE)]


def compare_path(a_path: str | Path, b_path: str | Path) -> Path:
    a, b = Path(a_path), Path(b_path)
    return a.with_name(f"{a.stem}-vs-{b.stem}.png")


def _draw_loss(ax: Any, ax2: Any, report: Mapping[str, Any], name: str, color: str) -> list[tuple[Any, str]]:
    steps = _timeline(report)
    drawn: list[tuple[Any, str]] = []
    points = [(s.t, s.loss) for s in steps if s.loss is not None]
    if points:
        window = min(50, max(3, len(points) // 20))
        (line,) = ax.plot(
            [p[0] for p in points], _rolling_mean([p[1] for p in points], window), color=color, lw=1.6
        )
        drawn.append((line, f"{name}: training loss (mean of {window})"))
    accuracy = _numbers(report, "test_accuracy_per_epoch")
    ends = _epoch_ends(report, steps, len(accuracy))
    marks = [(t, 100 * v) for t, v in zip(ends, accuracy, strict=False) if t is not None and v is not None]
    if marks:
        (acc,) = ax2.plot([m[0] for m in marks], [m[1] for m in marks], "o--", color=color, ms=5, lw=1.2)
        drawn.append((acc, f"{name}: test accuracy (last {marks[-1][1]:.1f}%)"))
    return drawn


def _draw_throughput(ax: Any, report: Mapping[str, Any], name: str, color: str) -> list[tuple[Any, str]]:
    series = _throughput(_timeline(report), _recoveries(report), _batch_size(report), THROUGHPUT_WINDOW)
    line = None
    for xs, ys in series:
        (line,) = ax.plot(xs, ys, color=color, lw=1.4, marker="o" if len(xs) == 1 else None, ms=4)
    if line is None:
        return []
    mean = finite(report.get("samples_per_second"))
    label = f"{name}: samples/s" + (f" (run average {mean:.0f})" if mean else "")
    return [(line, label)]


def plot_compare(
    a: Mapping[str, Any], b: Mapping[str, Any], names: tuple[str, str], path: str | Path
) -> Path:
    """Draw runs ``a`` and ``b`` (called ``names``) on shared axes into ``path``."""
    fig = new_figure(9.0, 8.0)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.set_title(f"{names[0]} against {names[1]}", fontsize=11)
    top.set_ylabel("training loss")
    top.grid(True, alpha=0.3)
    acc_ax = top.twinx()
    acc_ax.set_ylabel("test accuracy (%)")
    acc_ax.set_ylim(0, 108)
    bottom.set_xlabel("training time (s, evaluation excluded)")
    bottom.set_ylabel("samples/s")
    bottom.grid(True, alpha=0.3)
    loss: list[tuple[Any, str]] = []
    speed: list[tuple[Any, str]] = []
    for report, name, color in zip((a, b), names, RUN_COLORS, strict=True):
        loss += _draw_loss(top, acc_ax, report, name, color)
        speed += _draw_throughput(bottom, report, name, color)
    if loss:
        top.set_ylim(bottom=0)
    else:
        empty_note(top, "neither run recorded a batch")
    if speed:
        bottom.set_ylim(bottom=0)
    else:
        empty_note(bottom, "neither run recorded a batch")
    legend_below(top, [h for h, _ in loss], [t for _, t in loss], ncol=2)
    legend_below(bottom, [h for h, _ in speed], [t for _, t in speed], ncol=2)
    return save_png(fig, Path(path))
