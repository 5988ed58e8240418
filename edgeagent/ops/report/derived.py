"""Figures derived from a run report (pure: no matplotlib): a recovery's timings, epoch ends, the
throughput series and the per-batch intervals the plots draw.

The time axis is the report's: training seconds, evaluation excluded. After a recovery the timeline holds
the replayed batch ids again with larger times; per-batch figures use the *last* completion of each id.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgeagent.ops.report.parse import _int, _last_done, _recoveries, _Recovery, _Step, _timeline

DEFAULT_BATCH_SIZE = 32  # the CLI's default; used when the report does not say
PACE_WINDOW = 20  # batches before a fault whose mean time is the pre-fault pace


@dataclass(frozen=True)
class RecoveryTimes:
    """One fault's cost, in training seconds (evaluation excluded), counted three ways.

    * :attr:`detection`: the last progress before the fault (batch ``committed`` done) -> detection.
    * :attr:`recovery`: detection -> training resumes (probe, new split, weight moves, commit). This is
      what FTPipeHD's Table III "recover overhead" counts (papers/000 Sec. IV-E: 2.24 s; ResPipe 0.13 s).
    * :attr:`lost`: how much later the training is back where it was than in a fault-free run at the
      pre-fault pace: from the last progress until the first batch from ``batch`` on is completed after
      the resume (``redone_batch``: ``batch`` itself after a rollback, detection, recovery, pipeline
      refill and the replay of the rolled-back batches; the batch training resumes at when the dead
      stage was brought forward without one, its catch-up counted) minus the ``redone_batch -
      committed`` batches that would have followed the last progress without the fault. Replayed
      batches are redone work, so they count as lost.
    """

    batch: int  # the fault batch: the oldest one whose gradients never came
    committed: int  # the last batch completed before the fault
    last_progress: float
    detected: float
    resumed: float
    replayed: int
    pace: float | None  # seconds per batch over the PACE_WINDOW batches up to ``committed``
    redone: float | None  # when ``redone_batch`` was completed after the resume (None: never)
    redone_batch: int | None = None  # the first batch from ``batch`` on completed after it (None: ``batch``)

    @property
    def detection(self) -> float:
        return self.detected - self.last_progress

    @property
    def recovery(self) -> float:
        return self.resumed - self.detected

    @property
    def replay(self) -> float | None:
        """Training resumes -> ``redone_batch`` is done (pipeline refill and replayed batches)."""
        return None if self.redone is None else self.redone - self.resumed

    @property
    def lost(self) -> float | None:
        if self.redone is None or self.pace is None:
            return None
        done = self.batch if self.redone_batch is None else self.redone_batch
        return self.redone - self.last_progress - (done - self.committed) * self.pace


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
    after = next((s for s in steps if s.t > resumed and s.batch >= batch), None)
    return RecoveryTimes(
        batch=batch,
        committed=committed,
        last_progress=last_progress,
        detected=detected,
        resumed=resumed,
        replayed=rec.replayed if rec.replayed is not None else 0,
        pace=pace,
        redone=None if after is None else after.t,
        redone_batch=None if after is None else after.batch,
    )


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
