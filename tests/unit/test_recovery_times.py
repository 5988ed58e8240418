"""recovery_times: a fault's detection, recovery and total time lost, derived from a run report."""

from __future__ import annotations

from typing import Any

import pytest

from edgeagent.ops.report import recovery_times

STEP = 0.5  # seconds per batch before and after the fault


def _report(*, fault_at: int = 10, rolled_back_to: int = 8) -> dict[str, Any]:
    """Batches 0..fault_at-1 at STEP apart; the fault's batch ``fault_at`` never completes; detection
    1.5 s after the last progress, training resumes 2 s later, and the rolled-back batches are replayed
    (the first one takes 3 steps: the pipeline refills), then training goes on at the same pace."""
    timeline = [{"batch": b, "t": STEP * (b + 1), "loss": 1.0} for b in range(fault_at)]
    last = timeline[-1]["t"]
    detected, resumed = last + 1.5, last + 3.5
    t = resumed + 2 * STEP
    for b in range(rolled_back_to, fault_at + 5):
        t += STEP
        timeline.append({"batch": b, "t": t, "loss": 1.0})
    recovery = {
        "case": 3,
        "batch": fault_at,
        "last_progress_at": last,
        "detected_at": detected,
        "resumed_at": resumed,
        "rolled_back_to": rolled_back_to,
        "batches_replayed": fault_at - rolled_back_to,
    }
    return {"timeline": timeline, "recoveries": [recovery]}


def test_three_ways() -> None:
    times = recovery_times(_report())
    assert times is not None
    assert (times.batch, times.committed, times.replayed) == (10, 9, 2)
    assert times.detection == pytest.approx(1.5)
    assert times.recovery == pytest.approx(2.0)
    assert times.pace == pytest.approx(STEP)
    # Resume -> batch 10 done again: 2 refill steps, then batches 8, 9 and 10 at STEP each.
    assert times.replay == pytest.approx(5 * STEP)
    # Without the fault batch 10 would have been done one STEP after the last progress.
    assert times.lost == pytest.approx(1.5 + 2.0 + 5 * STEP - STEP)


def test_replayed_batches_count_as_lost() -> None:
    short, long = recovery_times(_report(rolled_back_to=9)), recovery_times(_report(rolled_back_to=5))
    assert short is not None and long is not None and short.lost is not None and long.lost is not None
    assert long.lost - short.lost == pytest.approx(4 * STEP)
    assert (short.detection, short.recovery) == (long.detection, long.recovery)


def test_pace_uses_the_window_before_the_fault() -> None:
    report = _report(fault_at=31)
    for row in report["timeline"][:10]:  # a faster start, outside the 20-batch window
        row["t"] = row["t"] / 10
    times = recovery_times(report)
    assert times is not None and times.pace == pytest.approx(STEP)
    wide = recovery_times(report, window=30)
    assert wide is not None and wide.pace is not None and wide.pace != pytest.approx(STEP)


def test_fault_batch_never_redone() -> None:
    report = _report()
    report["timeline"] = [r for r in report["timeline"] if r["t"] <= report["recoveries"][0]["resumed_at"]]
    times = recovery_times(report)
    assert times is not None
    assert times.redone is None and times.lost is None and times.replay is None
    assert times.recovery == pytest.approx(2.0)


@pytest.mark.parametrize(
    "report",
    [
        {},
        {"timeline": [], "recoveries": []},
        {"recoveries": [{"case": "central", "resumed_from": 100, "checkpoint": "x.pt"}]},
        {"recoveries": [{"case": 3, "batch": 10, "last_progress_at": 1.0}]},
    ],
)
def test_missing_or_untimed(report: dict[str, Any]) -> None:
    assert recovery_times(report) is None


def test_without_a_rollback_the_loss_runs_to_the_first_batch_after_the_resume() -> None:
    """--recovery-mode resume: the catch-up commits the fault batch 10 and 11 (in flight at the fault)
    between detection and resume; training resumes at 12, done 3 steps (the refill) after the resume."""
    timeline = [{"batch": b, "t": STEP * (b + 1), "loss": 1.0} for b in range(10)]
    last = timeline[-1]["t"]
    detected, resumed = last + 1.5, last + 3.5
    timeline += [{"batch": 10, "t": last + 2.5, "loss": 1.0}, {"batch": 11, "t": last + 2.6, "loss": 1.0}]
    timeline += [{"batch": b, "t": resumed + STEP * (b - 9), "loss": 1.0} for b in range(12, 16)]
    recovery = {
        "case": 3, "batch": 10, "last_progress_at": last, "detected_at": detected, "resumed_at": resumed,
        "rolled_back_to": 8, "batches_replayed": 2, "resumed_from": 12, "recovery_mode": "resume",
    }  # fmt: skip
    times = recovery_times({"timeline": timeline, "recoveries": [recovery]})
    assert times is not None and times.redone_batch == 12
    assert times.replay == pytest.approx(3 * STEP)
    # Without the fault batch 12 would have been done three STEPs after the last progress.
    assert times.lost == pytest.approx(1.5 + 2.0 + 3 * STEP - 3 * STEP)
