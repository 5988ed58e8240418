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


def _run(name: str, speed: float, accuracy: list[float]) -> dict[str, object]:
    return {
        "run_id": name,
        "mode": "pipeline",
        "model": "mlp",
        "dataset": "digits",
        "workers": ["w1", "w2"],
        "batch_size": 32,
        "batches": 40,
        "epochs": 2,
        "batches_per_epoch": 20,
        "final_accuracy": accuracy[-1],
        "samples_per_second": 32 * speed,
        "train_seconds": 40 / speed,
        "test_accuracy_per_epoch": accuracy,
        "timeline": [{"batch": i, "t": (i + 1) / speed, "loss": 2.0 - 0.03 * i} for i in range(40)],
    }


def test_compare_prints_both_runs_and_draws_them_on_shared_axes(tmp_path: Path) -> None:
    a, b = tmp_path / "fast.json", tmp_path / "slow.json"
    a.write_text(json.dumps(_run("a", 50.0, [0.8, 0.9])))
    b.write_text(json.dumps(_run("b", 20.0, [0.7, 0.85])))
    result = CliRunner().invoke(main, ["report", str(a), "--compare", str(b)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "fast" in lines[0] and "slow" in lines[0]
    accuracy = next(line for line in lines if line.startswith("final accuracy"))
    assert "90.00%" in accuracy and "85.00%" in accuracy
    speed = next(line for line in lines if line.startswith("samples/s"))
    assert "1600.0" in speed and "640.0" in speed
    png = tmp_path / "fast-vs-slow.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert not (tmp_path / "fast-loss.png").exists()  # a comparison does not re-plot the run


def test_compare_of_an_empty_report_still_draws(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_run("a", 50.0, [0.8])))
    b.write_text("{}")
    result = CliRunner().invoke(main, ["report", str(a), "--compare", str(b)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "a-vs-b.png").exists()
