"""PNG plots of a run report: which files, valid PNGs, and no exception on partial or odd reports."""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import pytest

from edgeagent.ops.report import write_plots
from edgeagent.ops.report.derived import _per_batch, _throughput
from edgeagent.ops.report.parse import _last_done, _recoveries, _splits, _timeline

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
KINDS = ("loss", "throughput", "partition")


def _report(*, fault: bool) -> dict[str, Any]:
    """A 4-epoch run of 40 batches per epoch; with ``fault``, worker-1 dies at batch 70, the run rolls back
    to batch 60 (replaying 60..69 later) and goes on with two stages."""
    timeline: list[dict[str, float]] = []
    t, b, pending = 0.0, 0, fault
    while b < 160:
        t += 0.02 + 0.005 * (b % 3)
        if pending and b == 70:
            t, b, pending = 3.0, 60, False  # after the resume; batch 60 is the first done after it
            continue
        timeline.append({"batch": b, "t": round(t, 4), "loss": 2.3 * math.exp(-b / 60) + 0.05 * (b % 5)})
        b += 1
    partitions: list[dict[str, Any]] = [
        {"batch": 0, "points": [0, 2, 4, 6], "plan_id": 0, "reason": "initial: equal devices (PipeDream)"},
        {
            "batch": 10,
            "points": [0, 3, 5, 6],
            "workers": ["worker-1", "worker-2"],
            "plan_id": 1,
            "reason": "x",
        },
    ]
    recoveries: list[dict[str, Any]] = []
    if fault:
        last = max(e["t"] for e in timeline if e["t"] < 3.0)
        recoveries.append(
            {
                "case": 3,
                "devices": ["worker-1"],
                "lost": ["worker-1"],
                "restarted": [],
                "batch": 70,
                "last_progress_at": last,
                "detected_at": last + 0.3,
                "resumed_at": 2.95,
                "rolled_back_to": 60,
                "batches_replayed": 10,
                "points": [0, 4, 6],
                "workers": ["worker-2"],
                "recovery": "ftpipehd",
            }
        )
        partitions.append({"batch": 60, "points": [0, 4, 6], "plan_id": 2, "reason": "recovery case 3: ..."})
        partitions.append(
            {"batch": 110, "points": [0, 3, 6], "workers": ["worker-2"], "plan_id": 3, "reason": "y"}
        )
    return {
        "run_id": "abc",
        "model": "mlp",
        "dataset": "digits",
        "workers": ["worker-1", "worker-2"],
        "final_accuracy": 0.9,
        "test_accuracy_per_epoch": [0.5, 0.7, 0.8, 0.9],
        "test_loss_per_epoch": [1.5, 0.9, 0.6, 0.4],
        "train_loss_per_epoch": [1.8, 1.0, 0.7, 0.5],
        "samples_per_second": 1000.0,
        "batches": 160,
        "epochs": 4,
        "wall_seconds": 9.0,
        "train_seconds": timeline[-1]["t"],
        "partitions": partitions,
        "recoveries": recoveries,
        "timeline": timeline,
    }


def _assert_png(path: Path, min_bytes: int = 10_000) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > min_bytes, f"{path} is only {len(data)} bytes"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_plots_with_a_recovery_are_valid_pngs(tmp_path: Path) -> None:
    json_path = tmp_path / "report.json"
    paths = write_plots(_report(fault=True), json_path)
    assert [p.name for p in paths] == [
        "report-loss.png",
        "report-throughput.png",
        "report-partition.png",
        "report-faults.png",
    ]
    for p in paths:
        assert p.parent == tmp_path
        width, height = _assert_png(p)
        assert width >= 1000 and height >= 500  # 150 dpi on a figure several inches wide


def test_no_faults_plot_without_recoveries(tmp_path: Path) -> None:
    stale = tmp_path / "run-faults.png"
    stale.write_bytes(b"left by an earlier run")
    paths = write_plots(_report(fault=False), str(tmp_path / "run.json"))
    assert [p.name for p in paths] == [f"run-{k}.png" for k in KINDS]
    for p in paths:
        _assert_png(p)
    assert not stale.exists()


@pytest.mark.parametrize(
    "report",
    [
        {},
        {"timeline": [], "partitions": [], "recoveries": [], "test_accuracy_per_epoch": []},
        {"timeline": [{"batch": 0, "t": 0.1, "loss": 2.3}], "batches": 1, "epochs": 0},
        {
            "timeline": "not a list",
            "partitions": [None, {"batch": "x"}, {"batch": 0, "points": [3, 1]}, {"batch": 0, "points": 4}],
            "recoveries": [None, {"case": 2, "points": 7}],
            "test_accuracy_per_epoch": [None, "x", float("nan")],
            "workers": 3,
            "samples_per_second": None,
        },
        # Aborted: the central stopped waiting after a fault, before any resume.
        {
            "timeline": [{"batch": i, "t": 0.05 * (i + 1), "loss": 2.0} for i in range(7)],
            "partitions": [{"batch": 0, "points": [0, 1, 2, 3], "reason": "initial"}],
            "workers": ["worker-1", "worker-2"],
            "recoveries": [{"case": 1, "batch": 7, "last_progress_at": 0.35, "detected_at": 2.0}],
        },
    ],
    ids=["empty", "empty-lists", "one-batch", "malformed", "aborted-after-fault"],
)
def test_partial_reports_do_not_raise(tmp_path: Path, report: dict[str, Any]) -> None:
    paths = write_plots(report, tmp_path / "r.json")
    names = [p.name for p in paths]
    assert names[:3] == [f"r-{k}.png" for k in KINDS]
    assert ("r-faults.png" in names) == bool(
        isinstance(report.get("recoveries"), list) and any(isinstance(r, dict) for r in report["recoveries"])
    )
    for p in paths:
        _assert_png(p, min_bytes=2_000)


def test_resumed_central_gets_a_faults_plot(tmp_path: Path) -> None:
    report = {
        "timeline": [{"batch": 100 + i, "t": 0.05 * (i + 1), "loss": 1.0} for i in range(30)],
        "partitions": [{"batch": 100, "points": [0, 2, 3]}],
        "batches": 130,
        "epochs": 3,
        "test_accuracy_per_epoch": [0.5, 0.6, 0.7],
        "recoveries": [{"case": "central", "resumed_from": 100}],
    }
    paths = write_plots(report, tmp_path / "resumed.json")
    assert paths[-1].name == "resumed-faults.png"
    _assert_png(paths[-1])


def test_per_batch_times_use_the_last_completion_of_a_replayed_batch() -> None:
    steps = _timeline(_report(fault=True))
    done = _last_done(steps)
    assert done[65] > 2.95  # replayed after the resume
    prev, t = _per_batch(steps)[60]  # the first batch after the resume spans the whole stall
    assert prev == done[59] < 2.95 < t
    assert all(t > prev for prev, t in _per_batch(steps).values())


def test_partitions_get_device_names_and_times() -> None:
    report = _report(fault=True)
    steps, recoveries = _timeline(report), _recoveries(report)
    splits = _splits(report, steps, recoveries)
    assert [s.names for s in splits] == [
        ["central", "worker-1", "worker-2"],
        ["central", "worker-1", "worker-2"],
        ["central", "worker-2"],  # from the recovery record
        ["central", "worker-2"],
    ]
    assert [s.recovery for s in splits] == [False, False, True, False]
    assert splits[2].t == 2.95  # a recovery's split takes effect at the resume
    assert splits[1].t == next(s.t for s in steps if s.batch == 9)


def test_throughput_windows_do_not_span_a_recovery() -> None:
    report = _report(fault=True)
    series = _throughput(_timeline(report), _recoveries(report), 32, 10)
    assert len(series) == 2
    (before_x, _), (after_x, after_y) = series
    assert max(before_x) < 2.95 <= min(after_x)
    assert min(after_y) > 32 / 0.5  # timed from the resume, not from before the stall
