"""Measured feedback on the hybrid mode's re-splits: a re-split is measured against the plan before it,
and the run goes back to that plan when the new one is slower (papers/000's re-split, with a check)."""

from __future__ import annotations

import logging
from concurrent.futures import Future

from edgeagent.modes.pipeline.central.context import Plan, RunState
from edgeagent.pipeline.groups import Groups

log = logging.getLogger("edgeagent.roles.central")

# After a re-split, the new plan's step is measured over this many batches; if it is this much slower
# than the plan before it measured, the run goes back to that plan and never picks the new one again.
MEASURE_BATCHES = 20
REVERT_MARGIN = 0.10


def plan_key(points: list[int], groups: Groups) -> tuple[tuple[int, ...], tuple[tuple[str, ...], ...]]:
    """What identifies a plan among those measured (its cuts and the devices of every stage)."""
    return tuple(points), groups.members


class Feedback:
    """Measured feedback on the hybrid run's re-splits: when the current plan started, the plan before it
    with its measured step, and the plans measured slower than the one before them (never picked again)."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        # When the current plan started (training clock, first batch), the plan before it with its measured
        # step, and plans measured slower than their predecessor.
        self.plan_started: tuple[float, int] | None = None
        self.previous: tuple[list[int], Groups, float] | None = None
        self.rejected: set[tuple[tuple[int, ...], tuple[tuple[str, ...], ...]]] = set()

    def next_batch(self) -> int:
        """The next batch to commit (the timeline repeats replayed batches after a rollback)."""
        timeline = self.state.report.timeline
        return int(timeline[-1]["batch"]) + 1 if timeline else self.state.start_version

    def measured_step(self) -> float | None:
        """Training seconds per batch of the current plan since it started (None before 5 batches)."""
        if self.plan_started is None:
            return None
        started, first = self.plan_started
        done = self.next_batch() - first
        return (self.state.clock() - started) / done if done >= 5 else None

    def check_previous(self, done: int) -> None:
        """``MEASURE_BATCHES`` after a re-split: back to the plan before if the new one measures slower."""
        state = self.state
        if self.previous is None or state.plan_job is not None or self.plan_started is None:
            return
        if done - self.plan_started[1] < MEASURE_BATCHES or done >= state.total:
            return
        points, groups, before = self.previous
        self.previous = None
        measured = self.measured_step()
        alive = all((w := state.workers.get(d)) is None or w.online for d in groups.devices[1:])
        slower = measured is not None and measured > (1 + REVERT_MARGIN) * before
        if not slower or not alive or plan_key(points, groups) in self.rejected:
            return
        assert measured is not None
        self.rejected.add(plan_key(state.points, state.groups))
        reason = (
            f"back to the plan before: the re-split measured {1e3 * measured:.1f} ms/batch, the plan "
            f"before {1e3 * before:.1f}"
        )
        log.warning("%s", reason)
        job: Future[Plan] = Future()
        job.set_result(Plan(points, before, reason, groups.primaries, groups))
        state.plan_job = job


__all__ = ["MEASURE_BATCHES", "REVERT_MARGIN", "Feedback", "plan_key"]
