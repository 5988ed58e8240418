"""The report's devices: rows from each device's last metrics, and `report-devices.png` drawn from them."""

from __future__ import annotations

from pathlib import Path

from edgeagent.ops.report import write_plots
from edgeagent.roles.central.devices import device_rows
from edgeagent.runtime.compute import TimeAccount


def test_rows_follow_the_run_order_and_keep_only_figures() -> None:
    latest = {
        "w2": {"stage": 2, "compute_s": 0.5, "idle_s": 0.1, "loss": 3.0, "bytes_sent": 10},
        "central": {"stage": 0, "compute_s": 1.0, "communication_s": float("nan")},
        "gone": {"compute_s": 0.2},  # left the run: after the run's own devices
    }
    rows = device_rows(
        latest, ["central", "w1", "w2"], {"w2": {"predicted_stage_s": 0.01, "measured_stage_s": 0.02}}
    )
    assert [r["device"] for r in rows] == ["central", "w2", "gone"]  # w1 sent nothing: left out
    assert rows[0] == {"device": "central", "stage": 0, "compute_s": 1.0}  # a NaN is not a figure
    assert rows[1] == {
        "device": "w2",
        "stage": 2,
        "compute_s": 0.5,
        "idle_s": 0.1,
        "bytes_sent": 10,
        "predicted_stage_s": 0.01,
        "measured_stage_s": 0.02,
    }


def test_time_account_figures_reset_with_the_run() -> None:
    account = TimeAccount(compute=1.0, communication=0.5, idle=2.0, sent_bytes=7, received_bytes=9)
    figures = account.figures()
    assert figures["compute_s"] == 1.0 and figures["bytes_sent"] == 7 and figures["bytes_received"] == 9
    account.reset()
    assert account.figures()["bytes_sent"] == 0 and account.figures()["compute_s"] == 0.0


def test_devices_png_only_with_devices(tmp_path: Path) -> None:
    report = {
        "model": "mlp",
        "dataset": "digits",
        "devices": [
            {"device": "central", "stage": 0, "compute_s": 0.3, "communication_s": 0.1, "idle_s": 0.4},
            {
                "device": "w1",
                "stage": 1,
                "compute_s": 0.2,
                "communication_s": 0.1,
                "idle_s": 0.9,
                "bytes_sent": 2_000_000,
                "bytes_received": 1_000,
                "predicted_stage_s": 0.004,
                "measured_stage_s": 0.005,
            },
            {"device": "broken"},  # no figures: not drawn
        ],
    }
    path = tmp_path / "run.json"
    written = write_plots(report, path)
    png = tmp_path / "run-devices.png"
    assert png in written and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # Re-plotting a report without devices removes the stale plot.
    assert png not in write_plots({"model": "mlp"}, path) and not png.exists()
