"""The report's devices (the pipeline bubble) from a real run: every device's compute, communication and
idle seconds and bytes as its metrics said, and `report-devices.png` drawn from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeagent.cli.demo import run_demo
from edgeagent.cli.runfiles import finish_report
from edgeagent.config import CentralConfig, TrainConfig

pytestmark = pytest.mark.slow


def test_a_short_run_reports_every_device_and_draws_them(
    amqtt_url: str, cluster: str, tmp_path: Path
) -> None:
    config = CentralConfig(cluster=cluster, train=TrainConfig(epochs=1), progress=False, metrics_interval=0.2)
    report = run_demo(config, workers=2, slowdowns=[], broker=amqtt_url, show_progress=False)
    rows = {row["device"]: row for row in report.devices}
    assert list(rows) == ["central", "worker-1", "worker-2"], report.devices
    for device, row in rows.items():
        assert row["compute_s"] > 0, (device, row)
        assert row["idle_s"] >= 0 and row["communication_s"] > 0, (device, row)
        assert row["bytes_sent"] > 0 and row["bytes_received"] > 0, (device, row)
        # The time account covers the device's run: its parts fit in its wall time.
        assert row["compute_s"] + row["communication_s"] + row["idle_s"] <= row["wall_s"] * 1.05, (
            device,
            row,
        )
    path = tmp_path / "run.json"
    finish_report(report, str(path))
    assert (tmp_path / "run-devices.png").stat().st_size > 10_000
