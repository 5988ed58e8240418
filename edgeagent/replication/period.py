"""ResPipe's replication period T in seconds, as batches (papers/002 Sec. 4.2), as pure functions.

ResPipe sends every worker's weights to its ``z`` next workers "at every T time units" (its testbed:
T = 30 s); FTPipeHD counts the period in batches. Replicas here are versioned by batch: every stage
snapshots at the same batch ids, so that a recovery finds one version all stages can be restored to
(:func:`~edgeagent.planner.recovery.choose_recovery_point`). A period in seconds is therefore turned
into batches by the central node, from its best knowledge of the time per committed batch: the planned
step before anything ran, then the measured commit rate: a plan's first :data:`RATE_WINDOW` batches
retune it (:func:`retune`: new :class:`ChainPoints` from a batch ahead of every stage) and every re-split
and recovery starts from it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

RATE_WINDOW = 50
"""Committed batches the measured rate is taken over (the latest ones): a few seconds of training on the
benches' models, long enough that one slow batch (an evaluation beside it) moves the rate little."""


def period_batches(seconds: float, batch_seconds: float) -> int:
    """Batches between replications for a period of ``seconds`` at one committed batch every
    ``batch_seconds``: the nearest whole number, at least 1 (a replication point needs a batch)."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"period {seconds!r} s: must be a finite number > 0")
    if not (math.isfinite(batch_seconds) and batch_seconds > 0):
        raise ValueError(f"time per batch {batch_seconds!r} s: must be a finite number > 0")
    return max(1, round(seconds / batch_seconds))


def measured_batch_seconds(commit_times: Sequence[float], window: int = RATE_WINDOW) -> float | None:
    """Seconds per committed batch over the latest ``window`` batches of ``commit_times`` (when each batch
    was committed, in order; a rollback's replays included, they are training time too), or None when
    fewer than two batches were committed or no time passed between them."""
    if window < 1:
        raise ValueError(f"window {window}: must be >= 1")
    times = commit_times[-(window + 1) :]
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (times[-1] - times[0]) / (len(times) - 1)


def planned_batch_seconds(stage_seconds: Sequence[float]) -> float | None:
    """Before anything ran: an asynchronous 1F1B pipeline commits one batch per bottleneck stage time
    (forward and backward of its slowest stage), the planned step; None when nothing is planned."""
    slowest = max(stage_seconds, default=0.0)
    return slowest if math.isfinite(slowest) and slowest > 0 else None


@dataclass(frozen=True)
class ChainPoints:
    """When a stage sends its chain replica: after ``done`` batches where ``done - start`` is a multiple of
    ``every`` (0: never), counted from ``start``; before ``start``, where ``before`` says. Every stage of a
    plan holds the same points, so the versions of one replication point form a consistent model."""

    every: int
    start: int = 0
    before: ChainPoints | None = None

    def due(self, done: int) -> bool:
        if done < self.start:
            return self.before is not None and self.before.due(done)
        return self.every > 0 and (done - self.start) % self.every == 0

    def then(self, every: int, start: int) -> ChainPoints:
        """Every ``every`` batches from ``start`` on, these points before it (one change back is kept: a
        change takes effect a margin ahead of every stage, and the next comes a rate window later)."""
        return ChainPoints(every, start, ChainPoints(self.every, self.start))


def retune(
    points: ChainPoints, seconds: float, batch_seconds: float | None, done: int, margin: int
) -> ChainPoints | None:
    """The chain points after ``done`` committed batches at ``batch_seconds`` per batch for a period of
    ``seconds``, or None to keep ``points``: when the period in batches is off by more than
    :data:`RETUNE_TOLERANCE`. The new points start ``margin`` batches ahead (past any batch a stage has
    finished, the command's way there included)."""
    if batch_seconds is None:
        return None
    every = period_batches(seconds, batch_seconds)
    if points.every > 0 and abs(every - points.every) <= RETUNE_TOLERANCE * points.every:
        return None
    # Not rounded to an old point: the old period may be far off (a planned step that left out the
    # links), and the new points are due as soon as every stage can take them.
    return points.then(every, done + margin)


RETUNE_TOLERANCE = 0.2
"""A measured period within this share of the current one changes nothing (no command for noise)."""


def chain_period(
    chain_every: int, chain_seconds: float | None, batch_seconds: float | None, *, current: int | None = None
) -> int:
    """The batches between chain replications a plan is sent with: ``chain_every`` when the period is in
    batches (``chain_seconds`` None); else ``chain_seconds`` at ``batch_seconds`` per batch, or, with no
    time per batch known yet, the ``current`` period (``chain_every`` when there is none)."""
    if chain_seconds is None:
        return chain_every
    if batch_seconds is None:
        return current if current is not None else chain_every
    return period_batches(chain_seconds, batch_seconds)


__all__ = [
    "RATE_WINDOW",
    "RETUNE_TOLERANCE",
    "ChainPoints",
    "chain_period",
    "measured_batch_seconds",
    "period_batches",
    "planned_batch_seconds",
    "retune",
]
