"""The allreduce run's plot (``report-allreduce.png``): seconds per step around failures, as papers/001's
Figs. 14-17.

Every step's allreduce time (the slowest member's, from the collective's start to its result) and its
whole time at the central node (step message to the last member's report) against the step number;
steps with a failed link (``--fail-link``) are shaded, a device excluded (it died) or joining is a
vertical line. Drawn in the style of :mod:`edgeagent.ops.report.style` (matplotlib's object API, Agg,
imported only when drawing); the registry entry names this plot, :mod:`edgeagent.ops.report.plots` draws
it for an allreduce report.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgeagent.ops.report.parse import finite
from edgeagent.ops.report.style import (
    LOSS_COLOR,
    RECOVERY_COLOR,
    RESUME_COLOR,
    empty_note,
    legend_below,
    new_figure,
    plot_title,
    save_png,
)

FAILED_COLOR = "#ffbb78"
STEP_COLOR = "#7f7f7f"


def allreduce_path(json_path: str | Path) -> Path:
    p = Path(json_path)
    stem = p.stem if p.suffix.lower() == ".json" else p.name
    return p.with_name(f"{stem}-allreduce.png")


def plot_allreduce(report: Mapping[str, Any], json_path: str | Path) -> Path | None:
    """Write ``<report>-allreduce.png`` for an allreduce report; None (nothing written) for others."""
    section = report.get("allreduce")
    if not isinstance(section, Mapping) or not section:
        return None
    its = [it for it in section.get("iterations", []) if isinstance(it, Mapping)]
    fig = new_figure(9.0, 4.8)
    ax = fig.add_subplot()
    path = allreduce_path(json_path)
    collective = section.get("collective", "?")
    timeout = section.get("timeout")
    ax.set_title(plot_title(report, f"{collective}, timeout {f'{timeout:g} s' if timeout else 'adaptive'}"))
    if not its:
        empty_note(ax, "no step finished")
        return save_png(fig, path)
    steps = [int(finite(it.get("step")) or 0) for it in its]
    handles: list[Any] = []
    labels: list[str] = []
    for step, it in zip(steps, its, strict=True):
        if it.get("failed_links"):
            span = ax.axvspan(step - 0.5, step + 0.5, color=FAILED_COLOR, alpha=0.5, linewidth=0)
            if "failed link" not in labels:
                handles.append(span)
                labels.append("failed link")
    (whole,) = ax.plot(steps, [finite(it.get("seconds")) or 0.0 for it in its], color=STEP_COLOR, lw=1)
    (coll,) = ax.plot(
        steps,
        [finite(it.get("collective_seconds")) or 0.0 for it in its],
        color=LOSS_COLOR,
        lw=1.5,
        marker=".",
    )
    handles += [coll, whole]
    labels += ["allreduce (slowest member)", "whole step (central node)"]
    for event in section.get("events", []):
        if not isinstance(event, Mapping) or event.get("name") not in (
            "allreduce-excluded",
            "allreduce-joined",
        ):
            continue
        joined = event.get("name") == "allreduce-joined"
        line = ax.axvline(
            finite(event.get("step")) or 0.0, color=RESUME_COLOR if joined else RECOVERY_COLOR, ls="--", lw=1
        )
        label = "device joined" if joined else "device excluded (died)"
        if label not in labels:
            handles.append(line)
            labels.append(label)
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    legend_below(ax, handles, labels)
    return save_png(fig, path)
