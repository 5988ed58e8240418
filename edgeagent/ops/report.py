"""PNG plots of a run report (the dict ``--report FILE`` writes as JSON), written beside the JSON.

``report.json`` gives ``report-loss.png`` (training loss and test accuracy over training time),
``report-throughput.png`` (samples/s over training time), ``report-partition.png`` (layers per stage
against batch id) and, only when the run had recoveries, ``report-faults.png`` (seconds per batch around
each fault).

Every field is read defensively: a report of an aborted run (an empty timeline, no epochs, missing keys)
still gives the plots that have something to show, with a note where there is nothing.

The time axis is the report's: training seconds, evaluation excluded. After a recovery the timeline holds
the replayed batch ids again with larger times; per-batch figures use the *last* completion of each id.
Drawing goes through matplotlib's object API and its Agg canvas (no pyplot, no display, no global state).
"""

from __future__ import annotations

import itertools
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["DEFAULT_BATCH_SIZE", "RecoveryTimes", "plot_paths", "recovery_times", "write_plots"]

DEFAULT_BATCH_SIZE = 32  # the CLI's default; used when the report does not say
DPI = 150
THROUGHPUT_WINDOW = 10  # batches per samples/s window
FAULT_SPAN = 15  # batches shown either side of a fault
MAX_FAULT_PANELS = 6
PACE_WINDOW = 20  # batches before a fault whose mean time is the pre-fault pace

RECOVERY_COLOR = "#d62728"
RESUME_COLOR = "#2ca02c"
PARTITION_COLOR = "#555555"
LOSS_COLOR = "#1f77b4"
ACCURACY_COLOR = "#ff7f0e"
# One colour per device (stage 0 = the central node first); tab10 without red (faults) and grey.
DEVICE_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]
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


# -- reading the report ---------------------------------------------------------------------------------


def _num(value: Any) -> float | None:
    """A finite number, or None (bools, strings, NaN and missing values are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    x = _num(value)
    return int(x) if x is not None and x == int(x) else None


def _list(report: Mapping[str, Any], key: str) -> list[Any]:
    value = report.get(key)
    return list(value) if isinstance(value, list | tuple) else []


def _numbers(report: Mapping[str, Any], key: str) -> list[float | None]:
    return [_num(v) for v in _list(report, key)]


def _strings(value: Any) -> list[str] | None:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        return None
    return list(value)


def _points(value: Any) -> list[int] | None:
    """Partition points (``n + 1`` non-decreasing layer indices for ``n`` stages), or None."""
    if not isinstance(value, list | tuple):
        return None
    points = [_int(v) for v in value]
    ints = [p for p in points if p is not None]
    if len(ints) < 2 or len(ints) != len(points) or ints[0] < 0:
        return None
    return ints if all(a <= b for a, b in itertools.pairwise(ints)) else None


@dataclass(frozen=True)
class _Step:
    """One timeline entry: batch ``batch`` finished at training second ``t`` with loss ``loss``."""

    batch: int
    t: float
    loss: float | None


@dataclass(frozen=True)
class _Recovery:
    case: str
    batch: int | None  # the fault batch (a resumed central: the checkpoint's batch)
    last_progress: float | None
    detected: float | None
    resumed: float | None
    rolled_back_to: int | None
    replayed: int | None
    lost: list[str]
    points: list[int] | None
    workers: list[str] | None
    central: bool  # a central node resumed from a checkpoint (no timing of its own)


@dataclass(frozen=True)
class _Split:
    """A partition in force from batch ``batch`` on; ``names`` has one entry per stage (stage 0 first)."""

    batch: int
    points: list[int]
    names: list[str]
    named: bool  # the device names are known (else "stage k")
    recovery: bool
    initial: bool
    t: float | None  # training second it took effect, when the timeline tells


def _timeline(report: Mapping[str, Any]) -> list[_Step]:
    steps: list[_Step] = []
    for entry in _list(report, "timeline"):
        if not isinstance(entry, Mapping):
            continue
        batch, t = _int(entry.get("batch")), _num(entry.get("t"))
        if batch is None or t is None:
            continue
        steps.append(_Step(batch, t, _num(entry.get("loss"))))
    steps.sort(key=lambda s: s.t)  # already in order; a stable sort keeps equal times as written
    return steps


def _last_done(steps: Sequence[_Step]) -> dict[int, float]:
    """The last completion time of each batch id (replayed batches count once, at their replay)."""
    done: dict[int, float] = {}
    for s in steps:
        done[s.batch] = s.t
    return done


def _recoveries(report: Mapping[str, Any]) -> list[_Recovery]:
    out: list[_Recovery] = []
    for rec in _list(report, "recoveries"):
        if not isinstance(rec, Mapping):
            continue
        case = rec.get("case")
        central = case == "central"
        lost = _strings(rec.get("lost")) or []
        points = _points(rec.get("points"))
        out.append(
            _Recovery(
                case=str(case) if case is not None else "?",
                batch=_int(rec.get("resumed_from")) if central else _int(rec.get("batch")),
                last_progress=_num(rec.get("last_progress_at")),
                detected=_num(rec.get("detected_at")),
                resumed=_num(rec.get("resumed_at")),
                rolled_back_to=_int(rec.get("rolled_back_to")),
                replayed=_int(rec.get("batches_replayed")),
                lost=lost,
                points=points,
                workers=_strings(rec.get("workers")),
                central=central,
            )
        )
    return out


# -- derived figures ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecoveryTimes:
    """One fault's cost, in training seconds (evaluation excluded), counted three ways.

    * :attr:`detection`: the last progress before the fault (batch ``committed`` done) -> detection.
    * :attr:`recovery`: detection -> training resumes (probe, new split, weight moves, commit). This is
      what FTPipeHD's Table III "recover overhead" counts (papers/000 Sec. IV-E: 2.24 s; ResPipe 0.13 s).
    * :attr:`lost`: how much later the fault batch ``batch`` is done than in a fault-free run at the
      pre-fault pace: from the last progress until ``batch`` is completed again (detection, recovery,
      pipeline refill and the replay of the rolled-back batches) minus the ``batch - committed``
      batches (normally one) that would have followed the last progress without the fault. Replayed
      batches are redone work, so they count as lost.
    """

    batch: int  # the fault batch: the oldest one whose gradients never came
    committed: int  # the last batch completed before the fault
    last_progress: float
    detected: float
    resumed: float
    replayed: int
    pace: float | None  # seconds per batch over the PACE_WINDOW batches up to ``committed``
    redone: float | None  # when ``batch`` was completed after the resume (None: never)

    @property
    def detection(self) -> float:
        return self.detected - self.last_progress

    @property
    def recovery(self) -> float:
        return self.resumed - self.detected

    @property
    def replay(self) -> float | None:
        """Training resumes -> the fault batch is done again (pipeline refill and replayed batches)."""
        return None if self.redone is None else self.redone - self.resumed

    @property
    def lost(self) -> float | None:
        if self.redone is None or self.pace is None:
            return None
        return self.redone - self.last_progress - (self.batch - self.committed) * self.pace


def recovery_times(
    report: Mapping[str, Any], index: int = 0, *, window: int = PACE_WINDOW
) -> RecoveryTimes | None:
    """The timings of the report's ``index``-th recovery (see :class:`RecoveryTimes`), or None when the
    report lacks what they need (a central node resumed from a checkpoint has no timings of its own)."""
    recoveries = _recoveries(report)
    if not 0 <= index < len(recoveries):
        return None
    rec = recoveries[index]
    batch, last_progress, detected, resumed = rec.batch, rec.last_progress, rec.detected, rec.resumed
    if rec.central or batch is None or last_progress is None or detected is None or resumed is None:
        return None
    steps = _timeline(report)
    # The pre-fault steps: since the previous recovery resumed (its replays would skew the pace).
    since = recoveries[index - 1].resumed if index else None
    before = [s for s in steps if s.t <= last_progress and (since is None or s.t > since)]
    pace = None
    if len(before) >= 2:
        k = min(window, len(before) - 1)
        pace = (before[-1].t - before[-1 - k].t) / k
    committed = before[-1].batch if before else batch - 1
    redone = next((s.t for s in steps if s.t > resumed and s.batch == batch), None)
    return RecoveryTimes(
        batch=batch,
        committed=committed,
        last_progress=last_progress,
        detected=detected,
        resumed=resumed,
        replayed=rec.replayed if rec.replayed is not None else 0,
        pace=pace,
        redone=redone,
    )


def _stage_names(workers: list[str] | None, stages: int) -> list[str] | None:
    """Device per stage: partition entries list the workers after the central node (stage 0)."""
    if workers is None:
        return None
    if len(workers) == stages - 1:
        return ["central", *workers]
    if len(workers) == stages:
        return list(workers)
    return None


def _splits(
    report: Mapping[str, Any], steps: Sequence[_Step], recoveries: Sequence[_Recovery]
) -> list[_Split]:
    """The partitions in the order they took effect, with device names and times where they can be told."""
    all_workers = _strings(report.get("workers"))
    unmatched = [r for r in recoveries if not r.central]
    splits: list[_Split] = []
    previous: list[str] | None = None
    not_before = -math.inf
    for i, entry in enumerate(_list(report, "partitions")):
        if not isinstance(entry, Mapping):
            continue
        batch, pts = _int(entry.get("batch")), _points(entry.get("points"))
        if batch is None or pts is None:
            continue
        stages = len(pts) - 1
        reason = entry.get("reason")
        recovery_reason = isinstance(reason, str) and reason.startswith("recovery")
        match = next(
            (r for r in unmatched if r.rolled_back_to == batch and (r.points is None or r.points == pts)),
            None,
        )
        recovery = match is not None or recovery_reason
        if match is not None:
            unmatched.remove(match)
        names = _stage_names(_strings(entry.get("workers")), stages)
        if names is None and match is not None:
            names = _stage_names(match.workers, stages)
        if names is None and not splits:
            names = _stage_names(all_workers, stages)
        if names is None and previous is not None and len(previous) == stages:
            names = list(previous)  # the same devices, a new split
        named = names is not None
        if names is None:
            names = ["central", *(f"stage {k}" for k in range(1, stages))]  # stage 0 is the central node
        else:
            previous = names
        t: float | None = None
        if match is not None and match.resumed is not None:
            t = match.resumed
        elif batch == 0 and i == 0:
            t = 0.0
        else:
            t = next((s.t for s in steps if s.batch == batch - 1 and s.t >= not_before), None)
        if t is not None:
            not_before = t
        splits.append(_Split(batch, pts, names, named, recovery, initial=not splits, t=t))
    return splits


def _batches_per_epoch(report: Mapping[str, Any], steps: Sequence[_Step], epochs: int) -> int | None:
    explicit = _int(report.get("batches_per_epoch"))
    if explicit and explicit > 0:
        return explicit
    if epochs <= 0:
        return None
    batches = _int(report.get("batches"))
    if not batches and steps:
        batches = max(s.batch for s in steps) + 1
    if not batches:
        return None
    return max(1, math.ceil(batches / epochs))  # the last epoch may be shorter (--max-batches)


def _epoch_ends(report: Mapping[str, Any], steps: Sequence[_Step], epochs: int) -> list[float | None]:
    """Training second at which each epoch's last batch (last completion) finished, when known."""
    per_epoch = _batches_per_epoch(report, steps, epochs)
    if per_epoch is None or not steps:
        return [None] * epochs
    done = _last_done(steps)
    last_id = max(done)
    ends: list[float | None] = []
    for e in range(epochs):
        end_id = (e + 1) * per_epoch - 1
        t = done.get(end_id)
        if t is None and e == epochs - 1 and end_id >= last_id:
            t = done[last_id]  # a shorter last epoch ends with the run
        ends.append(t)
    return ends


def _batch_size(report: Mapping[str, Any]) -> int:
    size = _int(report.get("batch_size"))
    return size if size and size > 0 else DEFAULT_BATCH_SIZE


def _rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """Centred mean over ``window`` values (fewer at the ends)."""
    half = max(0, window // 2)
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    out = []
    for i in range(len(values)):
        lo, hi = max(0, i - half), min(len(values), i + half + 1)
        out.append((prefix[hi] - prefix[lo]) / (hi - lo))
    return out


def _split_at_faults(
    points: Sequence[tuple[float, float]], recoveries: Sequence[_Recovery]
) -> list[list[tuple[float, float]]]:
    """Cut a (time, value) series where a fault was detected, so no line bridges a recovery."""
    cuts = sorted(r.detected for r in recoveries if r.detected is not None)
    pieces: list[list[tuple[float, float]]] = [[]]
    for p in points:
        if pieces[-1] and any(pieces[-1][-1][0] < c <= p[0] for c in cuts):
            pieces.append([])
        pieces[-1].append(p)
    return [piece for piece in pieces if piece]


def _throughput(
    steps: Sequence[_Step], recoveries: Sequence[_Recovery], batch_size: int, window: int
) -> list[tuple[list[float], list[float]]]:
    """Samples/s over the last ``window`` completed batches (replays included: work the pipeline did), one
    series per stretch between recoveries. A stretch's first batches are timed from its start: second 0,
    or the resume of the recovery that began it; no window spans a recovery."""
    resumes = sorted(r.resumed for r in recoveries if r.resumed is not None)
    pieces = _split_at_faults([(s.t, 0.0) for s in steps], recoveries)
    out: list[tuple[list[float], list[float]]] = []
    previous_end = 0.0
    for piece in pieces:
        first = piece[0][0]
        start = max([previous_end, *(r for r in resumes if r <= first)]) if out else 0.0
        times = [start, *(p[0] for p in piece)]
        xs, ys = [], []
        for i in range(1, len(times)):
            j = max(0, i - window)
            dt = times[i] - times[j]
            if dt > 0:
                xs.append(times[i])
                ys.append(batch_size * (i - j) / dt)
        if xs:
            out.append((xs, ys))
        previous_end = piece[-1][0]
    return out


def _seconds(x: float) -> str:
    return f"{x:.2f} s" if x >= 0.1 else f"{1e3 * x:.0f} ms" if x >= 1e-3 else f"{1e3 * x:.2f} ms"


# -- drawing helpers ------------------------------------------------------------------------------------


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.15, format="png")
    return path


def _note(ax: Axes, text: str) -> None:
    """An empty panel saying why it is empty."""
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="#555555")


def _title(report: Mapping[str, Any], what: str) -> str:
    model, dataset = report.get("model"), report.get("dataset")
    if isinstance(model, str) and isinstance(dataset, str) and model and dataset:
        return f"{what}: {model} on {dataset}"
    return what


def _legend_below(ax: Axes, handles: list[Any], labels: list[str], ncol: int = 3) -> None:
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
    fig = _figure(9.0, 5.0)
    ax = fig.add_subplot()
    ax.set_title(_title(report, "Training loss and test accuracy"), fontsize=11)
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
        _note(ax, "no batches recorded: the run stopped before its first batch finished")
    _legend_below(ax, handles, labels)
    return _save(fig, path)


def _plot_throughput(
    report: Mapping[str, Any],
    steps: Sequence[_Step],
    recoveries: Sequence[_Recovery],
    splits: Sequence[_Split],
    path: Path,
) -> Path:
    fig = _figure(9.0, 4.6)
    ax = fig.add_subplot()
    ax.set_title(_title(report, "Training throughput"), fontsize=11)
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
        mean = _num(report.get("samples_per_second"))
        if mean is None and steps and steps[-1].t > 0:
            mean = size * len(steps) / steps[-1].t
        if mean:
            avg = ax.axhline(mean, color="#7f7f7f", lw=1, ls="--")
            handles.append(avg)
            labels.append(f"run average: {mean:.0f} samples/s")
        peak = max(max(ys) for _, ys in series)
        ax.set_ylim(bottom=0, top=peak * 1.1 if peak > 0 else 1.0)
    else:
        _note(ax, "no batches recorded: the run stopped before its first batch finished")
    event_handles, event_labels = _mark_events(ax, recoveries, splits)
    _legend_below(ax, handles + event_handles, labels + event_labels, ncol=3)
    return _save(fig, path)


def _device_colors(splits: Sequence[_Split]) -> dict[str, str]:
    colors: dict[str, str] = {}
    for s in splits:
        for name in s.names:
            if name not in colors:
                colors[name] = DEVICE_COLORS[len(colors) % len(DEVICE_COLORS)]
    return colors


def _plot_partition(
    report: Mapping[str, Any],
    steps: Sequence[_Step],
    recoveries: Sequence[_Recovery],
    splits: Sequence[_Split],
    path: Path,
) -> Path:
    from matplotlib.patches import Patch, Rectangle

    fig = _figure(9.0, 4.8)
    ax = fig.add_subplot()
    ax.set_title(_title(report, "Layers per pipeline stage"), fontsize=11)
    ax.set_xlabel("batch id")
    ax.set_ylabel("layers (stacked in pipeline order)")
    if not splits:
        _note(ax, "no partition recorded")
        ax.set_yticks([])
        return _save(fig, path)

    batches = _int(report.get("batches")) or 0
    end = max([batches, *(s.batch + 1 for s in steps), *(s.batch + 1 for s in splits)])
    layers = max(1, *(s.points[-1] for s in splits))
    colors = _device_colors(splits)
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
            width_in = axes_w * (stop - s.batch) / end
            height_in = axes_h * (hi - lo) / layers
            count = f"{hi - lo} layer{'s' if hi - lo != 1 else ''}"
            text = f"{name}\n{count}" if height_in >= 0.34 else f"{name}: {count}"
            if height_in < 0.17 or width_in < 0.075 * max(len(line) for line in text.split("\n")) + 0.1:
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
    handles: list[Any] = [Patch(facecolor=c, label=n) for n, c in colors.items()]
    labels = list(colors)
    fault_labeled = split_labeled = False
    for r in recoveries:
        if r.central or r.batch is None:
            continue
        line = ax.axvline(r.batch, color=RECOVERY_COLOR, lw=1.6)
        if not fault_labeled:
            handles.append(line)
            labels.append("fault (batch it hit)")
            fault_labeled = True
    for s in splits:
        if s.initial or s.recovery:
            continue
        line = ax.axvline(s.batch, color="black", lw=1.1, ls=":")
        if not split_labeled:
            handles.append(line)
            labels.append("re-partition decided")
            split_labeled = True
    for r in recoveries:
        if r.central and r.batch is not None:
            line = ax.axvline(r.batch, color=RESUME_COLOR, lw=1.6, ls="--")
            handles.append(line)
            labels.append(f"central resumed from batch {r.batch}")
            break
    ax.set_xlim(0, end)
    ax.set_ylim(0, layers)
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if not all(s.named for s in splits):
        ax.set_title(
            _title(report, "Layers per pipeline stage")
            + "\n(worker names unknown for some splits: shown as stage numbers)",
            fontsize=11,
        )
    _legend_below(ax, handles, labels, ncol=5)
    return _save(fig, path)


def _bar_segments(r: _Recovery, prev: float, done: float) -> list[tuple[str, float, float]]:
    """Split one batch's interval ``(prev, done]`` at the recovery's events, when it spans the fault."""
    if r.detected is None or not prev < r.detected <= done:
        return []
    cuts: list[tuple[str, float, float]] = []
    stalled = (
        r.last_progress if r.last_progress is not None and prev <= r.last_progress <= r.detected else prev
    )
    resumed = r.resumed if r.resumed is not None and r.detected <= r.resumed <= done else r.detected
    for key, lo, hi in (
        ("lost", prev, stalled),
        ("detect", stalled, r.detected),
        ("recover", r.detected, resumed),
        ("after", resumed, done),
    ):
        if hi - lo > 0.002 * (done - prev):  # leave out slivers (e.g. no work lost: nothing replayed)
            cuts.append((key, lo, hi))
    return cuts


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
    if r.rolled_back_to is not None:
        replayed = f", {r.replayed} replayed" if r.replayed is not None else ""
        parts.append(f"rolled back to batch {r.rolled_back_to}{replayed}")
    return "\n".join([head, *textwrap.wrap("; ".join(parts), 90)])


def _per_batch(steps: Sequence[_Step]) -> dict[int, tuple[float, float]]:
    """Batch id -> (previous id's last completion, its own last completion); the first id counts from the
    start of training (second 0)."""
    done = _last_done(steps)
    first = min(done) if done else None
    out: dict[int, tuple[float, float]] = {}
    for b, t in done.items():
        prev = done.get(b - 1, 0.0 if b == first else None)
        if prev is not None and t > prev:
            out[b] = (prev, t)
    return out


def _fault_panel(ax: Axes, side: Axes, r: _Recovery, per_batch: Mapping[int, tuple[float, float]]) -> None:
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    side.axis("off")
    if r.batch is None:
        _note(ax, "no batch recorded for this recovery")
        return
    lo = r.batch - FAULT_SPAN
    if r.rolled_back_to is not None:
        lo = min(lo, r.rolled_back_to - 3)  # show the batches replayed after the rollback too
    lo, hi = max(0, lo), r.batch + FAULT_SPAN
    ax.set_xlim(lo - 0.7, hi + 0.7)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ids = [b for b in range(lo, hi + 1) if b in per_batch]
    if not ids:
        _note(ax, "no batch timings around this fault in the timeline")
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
    fig = _figure(10.0, 0.4 + 3.6 * len(shown))
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
    return _save(fig, path)


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
    return written
