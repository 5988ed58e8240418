"""Reading a run report: the JSON dict ``--report FILE`` writes, as typed records.

Every field is read defensively: a report of an aborted run (an empty timeline, no epochs, missing keys)
gives empty lists and Nones here, never an exception.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def finite(value: Any) -> float | None:
    """A finite number, or None (bools, strings, NaN and missing values are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    x = finite(value)
    return int(x) if x is not None and x == int(x) else None


def _list(report: Mapping[str, Any], key: str) -> list[Any]:
    value = report.get(key)
    return list(value) if isinstance(value, list | tuple) else []


def _numbers(report: Mapping[str, Any], key: str) -> list[float | None]:
    return [finite(v) for v in _list(report, key)]


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
    rollback: bool = True  # every stage went back (False: only the dead one, --recovery-mode resume)


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
        batch, t = _int(entry.get("batch")), finite(entry.get("t"))
        if batch is None or t is None:
            continue
        steps.append(_Step(batch, t, finite(entry.get("loss"))))
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
                last_progress=finite(rec.get("last_progress_at")),
                detected=finite(rec.get("detected_at")),
                resumed=finite(rec.get("resumed_at")),
                rolled_back_to=_int(rec.get("rolled_back_to")),
                replayed=_int(rec.get("batches_replayed")),
                lost=lost,
                points=points,
                workers=_strings(rec.get("workers")),
                central=central,
                rollback=rec.get("recovery_mode", "rollback") != "resume",
            )
        )
    return out


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
