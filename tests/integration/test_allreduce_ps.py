"""The thesis's parameter-server baselines (``--collective ps-sync|ps-async``) with real processes and a
real broker: the central node is the server.

ps-sync waits for every member's gradient and applies their mean: the trained model equals the same
single-process reference as the allreduce collectives' (each step's exact mean over its members' shards).
ps-async applies each gradient as it arrives, scaled by 1/n: no fixed order, so what is checked is that
every gradient was applied once and the model learned.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_allreduce import check_model, run

pytestmark = pytest.mark.slow


def test_ps_sync_applies_the_exact_mean_of_every_step(amqtt_url: str, tmp_path: Path) -> None:
    saved = tmp_path / "model.pt"
    report, _ = run(amqtt_url, 3, 6, saved, collective="ps-sync")
    assert report.mode == "allreduce" and report.allreduce["collective"] == "ps-sync"
    iterations = report.allreduce["iterations"]
    assert [it["step"] for it in iterations] == list(range(6))
    assert all(it["members"] == report.workers[1:] for it in iterations)
    check_model(report, saved)


def test_ps_async_applies_every_gradient_once_and_learns(amqtt_url: str, tmp_path: Path) -> None:
    steps = 12
    report, _ = run(amqtt_url, 3, steps, tmp_path / "model.pt", collective="ps-async")
    assert report.allreduce["collective"] == "ps-async"
    iterations = report.allreduce["iterations"]
    assert iterations, report.allreduce
    losses = [it["loss"] for it in iterations]
    assert sum(losses[-4:]) < sum(losses[:4]), losses
    assert report.final_accuracy > 0.3, report.test_accuracy_per_epoch
