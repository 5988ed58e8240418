"""`edgeagent report FILE.json` draws a run's plots again."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from edgeagent.cli.main import main


def test_report_replots_beside_the_json(tmp_path: Path) -> None:
    report = {
        "run_id": "r",
        "model": "cnn",
        "dataset": "digits",
        "workers": ["central", "w1"],
        "timeline": [{"batch": i, "time": 0.1 * i, "loss": 2.0 - 0.01 * i} for i in range(20)],
        "partitions": [{"batch": 0, "time": 0.0, "points": [0, 2, 4], "workers": ["central", "w1"]}],
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    result = CliRunner().invoke(main, ["report", str(path)])
    assert result.exit_code == 0, result.output
    for kind in ("loss", "throughput", "partition"):
        assert (tmp_path / f"run-{kind}.png").stat().st_size > 1000


def test_not_a_report_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("[1, 2]")
    result = CliRunner().invoke(main, ["report", str(path)])
    assert result.exit_code != 0
    assert "not a run report" in result.output
