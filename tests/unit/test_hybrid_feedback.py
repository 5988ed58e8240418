"""Measured feedback on hybrid re-splits (modes/pipeline/central/hybrid_feedback.py): a re-split that measures
slower than the plan before it is undone, and the DP's plan is not chosen again. The run's state is set
by hand: these rules read only the plan, the timeline and the clock."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from edgeagent.modes.pipeline.central.hybrid_feedback import (
    MEASURE_BATCHES,
    RETRY_BATCHES,
    Feedback,
    plan_key,
)
from edgeagent.pipeline.groups import Groups
from edgeagent.roles.central.node import DeviceState
from edgeagent.roles.central.report import RunReport

OLD = Groups((("central",), ("w1", "w2")), ((1.0,), (0.5, 0.5)))
NEW = Groups((("central",), ("w1",), ("w2",)), ((1.0,), (1.0,), (1.0,)))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def a_run(before: float) -> tuple[Any, Clock]:
    """The hybrid run's feedback just after a switch from OLD ([0, 2, 3], measured ``before`` s/batch) to
    NEW at batch 100."""
    clock = Clock()
    state: Any = SimpleNamespace(
        clock=clock,
        report=RunReport(run_id="r", model="m", dataset="d", workers=["w1", "w2"]),
        points=[0, 1, 2, 3],
        groups=NEW,
        plan_job=None,
        total=1000,
        start_version=0,
        workers={d: DeviceState(d, 0.0) for d in ("w1", "w2")},
    )
    run = Feedback(state)
    run.previous = ([0, 2, 3], OLD, before)
    run.plan_started = (0.0, 100)
    return run, clock


def commit(run: Any, clock: Clock, until: int, step: float) -> None:
    start = int(run.state.report.timeline[-1]["batch"]) + 1 if run.state.report.timeline else 100
    for batch in range(start, until):
        clock.now += step
        run.state.report.timeline.append({"batch": batch, "t": clock.now, "loss": 1.0})


def test_a_slower_re_split_is_undone_and_not_chosen_again() -> None:
    run, clock = a_run(before=0.010)
    commit(run, clock, 100 + MEASURE_BATCHES - 1, step=0.030)
    run.check_previous(100 + MEASURE_BATCHES - 1)
    assert run.state.plan_job is None  # not measured long enough yet
    commit(run, clock, 100 + MEASURE_BATCHES, step=0.030)
    run.check_previous(100 + MEASURE_BATCHES)
    job = getattr(run.state, "plan_job")  # noqa: B009 - a fresh read: the check above narrowed it to None
    plan = job.result()
    assert plan.points == [0, 2, 3] and plan.groups == OLD and "back to the plan before" in plan.reason
    assert plan_key([0, 1, 2, 3], NEW) in run.rejected and run.previous is None


def test_a_re_split_that_measures_as_fast_stays() -> None:
    run, clock = a_run(before=0.010)
    commit(run, clock, 100 + MEASURE_BATCHES, step=0.0105)  # within the 10 % margin
    run.check_previous(100 + MEASURE_BATCHES)
    assert run.state.plan_job is None and run.rejected == set() and run.previous is None


def test_no_way_back_to_a_plan_whose_device_is_gone() -> None:
    run, clock = a_run(before=0.010)
    run.state.workers["w2"].online = False
    commit(run, clock, 100 + MEASURE_BATCHES, step=0.030)
    run.check_previous(100 + MEASURE_BATCHES)
    assert run.state.plan_job is None


def test_a_device_left_out_for_its_speed_is_tried_again_with_a_doubling_backoff() -> None:
    run, _ = a_run(before=0.010)  # the plan: central, w1, w2; w3 left out, measured 20x slower
    caps = {"w1": 1.0, "w2": 1.0, "w3": 20.0}
    with_w3 = plan_key(
        [0, 1, 2, 3], Groups((("central",), ("w1", "w3"), ("w2",)), ((1.0,), (0.9, 0.1), (1.0,)))
    )
    without = plan_key([0, 2, 3], OLD)
    run.rejected = {with_w3, without}
    assert run.retry_left_out(100, ["w1", "w2", "w3"], caps) == []  # left out from now on
    assert run.retry_left_out(100 + RETRY_BATCHES - 1, ["w1", "w2", "w3"], caps) == []
    assert caps["w3"] == 20.0
    assert run.retry_left_out(100 + RETRY_BATCHES, ["w1", "w2", "w3"], caps) == ["w3"]
    assert "w3" not in caps and caps == {"w1": 1.0, "w2": 1.0}  # planned at the others' mean
    assert run.rejected == {without}  # plans with w3 may be picked again; the others stay rejected
    # Planned in, measured slow again (its capacity back in caps), and left out once more: twice the wait.
    caps["w3"] = 20.0
    again = 200
    assert run.retry_left_out(again, ["w1", "w2", "w3"], caps) == []
    assert run.retry_left_out(again + 2 * RETRY_BATCHES - 1, ["w1", "w2", "w3"], caps) == []
    assert run.retry_left_out(again + 2 * RETRY_BATCHES, ["w1", "w2", "w3"], caps) == ["w3"]


def test_devices_in_the_plan_or_planned_at_the_mean_are_not_retried() -> None:
    run, _ = a_run(before=0.010)
    caps = {"w1": 1.0, "w2": 30.0}  # w2 is in the plan (NEW), however slow; w4 joined: no capacity yet
    for done in (100, 100 + RETRY_BATCHES, 100 + 10 * RETRY_BATCHES):
        assert run.retry_left_out(done, ["w1", "w2", "w4"], caps) == []
    assert caps == {"w1": 1.0, "w2": 30.0} and run.out_since == {}
