"""The per-hop breakdown: pairs a sender's records with the receiver's by topic and batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeagent.runtime import hoptrace
from edgeagent.runtime.hoptrace import HopTrace, Record, breakdown, read

ACT = "edgeagent/v1/c/stage/0/act/central"


def _hop(t0: float, batch: int) -> list[Record]:
    """One activation of ``batch`` from p1 to p2: 1 ms encode, 2 publish (the call), 5 relay (publish ->
    arrive), 4 decode, 5 queue."""
    times = [0, 1, 3, 6, 10, 15]
    procs = ["p1", "p1", "p1", "p2", "p2", "p2"]
    return [
        Record(t0 + dt / 1e3, event, ACT, batch, proc)
        for dt, event, proc in zip(times, hoptrace.EVENTS[:6], procs, strict=True)
    ]


def test_breakdown_of_one_hop_and_a_compute_step() -> None:
    records = [r for b in range(30) for r in _hop(b, b)]
    compute = "stage/1/compute"
    records += [Record(b + 0.5, "forward", compute, b, "p2") for b in range(30)]
    records += [Record(b + 0.5 + 0.007, "computed", compute, b, "p2") for b in range(30)]
    result = breakdown(records, skip=20)
    assert result["stage 0 act"] == pytest.approx(
        {"encode": 1.0, "publish": 2.0, "relay": 5.0, "decode": 4.0, "queue": 5.0}
    )
    assert result["stage 1 compute"] == pytest.approx({"forward": 7.0})


def test_trace_files_round_trip_and_bad_lines_are_skipped(tmp_path: Path) -> None:
    trace = HopTrace(str(tmp_path))
    trace.mark("encode", ACT, 3, 100.0)
    trace.flush()
    with open(next(tmp_path.glob("*.trace")), "a", encoding="utf-8") as f:
        f.write("garbage line\n1.0 nonsense topic 1\n2.0 sent topic x\n")
    records = read(tmp_path)
    assert [(r.t, r.event, r.topic, r.batch_id) for r in records] == [(100.0, "encode", ACT, 3)]


def test_off_by_default_records_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hoptrace, "TRACE", None)
    hoptrace.mark("encode", ACT, object())  # no batch id, no trace: nothing happens
    hoptrace.compute("forward", 0, 1, 0.0)
    assert hoptrace.now() == 0.0


def test_the_edgeagent_program_writes_its_trace_out_at_exit(tmp_path: Path) -> None:
    """``edgeagent`` leaves with ``os._exit`` (no atexit): a worker's records must still reach the file."""
    script = (
        "import sys\n"
        "from edgeagent.runtime import hoptrace\n"
        f"hoptrace.TRACE.mark('sent', {ACT!r}, 7, 5.0)\n"
        "from edgeagent.cli.main import entry\n"
        "sys.argv = ['edgeagent', '--version']\n"
        "entry()\n"
    )
    env = dict(os.environ, **{hoptrace.ENV: str(tmp_path)})
    subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, timeout=120)
    assert [(r.event, r.batch_id) for r in read(tmp_path)] == [("sent", 7)]
