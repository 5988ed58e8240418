"""Measured feedback on the hybrid mode's re-splits: a re-split is measured against the plan before it,
and the run goes back to that plan when the new one is slower (papers/000's re-split, with a check); a
device the plan left out is tried again now and then, with a backoff, in case it became faster."""

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
# A device left out of the plan (measured too slow to help) is tried again after this many batches out,
# twice as many after each retry: a Pi that was throttled or busy and recovered gets back in, and one
# that stays slow costs a few measured re-splits over the whole run (at 50, 150, 350, 750, ... batches).
RETRY_BATCHES = 50


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
        # Devices out of the plan: the batch they were left out (or last retried) at, and how many batches
        # out it takes for their next retry.
        self.out_since: dict[str, int] = {}
        self.retry_after: dict[str, int] = {}

    def retry_left_out(self, done: int, candidates: list[str], caps: dict[str, float]) -> list[str]:
        """The devices among ``candidates`` (those the next plan may use) that the current plan leaves out
        for their measured capacity (in ``caps``) and that have been out long enough to be tried again
        (``RETRY_BATCHES``, doubling per retry): their capacities are forgotten from ``caps`` (the planner
        then takes them as the mean of the others, as it takes a device that joins) and so are the
        rejected plans that hold them. A plan that uses one is measured like any re-split
        (:meth:`check_previous`): if it is slower the run goes back, with the device measured anew."""
        in_plan = set(self.state.groups.devices)
        retried = []
        for device in candidates:
            if device in in_plan or device not in caps:  # in the plan, or planned at the mean already
                self.out_since.pop(device, None)
                continue
            since = self.out_since.setdefault(device, done)
            wait = self.retry_after.get(device, RETRY_BATCHES)
            if done - since < wait:
                continue
            del caps[device]
            self.rejected = {key for key in self.rejected if all(device not in g for g in key[1])}
            self.out_since.pop(device)
            self.retry_after[device] = 2 * wait
            retried.append(device)
        return retried

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


__all__ = ["MEASURE_BATCHES", "RETRY_BATCHES", "REVERT_MARGIN", "Feedback", "plan_key"]
