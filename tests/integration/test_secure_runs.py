"""Whole runs with logins and topic rights enforced: the embedded broker and Mosquitto.

Every device logs in with its own password and may publish only its own topics and its stage's
outputs; re-partitions and recovery move stages between devices while the broker watches.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeagent.cli.demo import run_demo, throwaway_logins
from edgeagent.config import CentralConfig, TrainConfig
from tests.conftest import MosquittoProcess

pytestmark = pytest.mark.slow


@pytest.mark.serial  # the re-split away from the 4x slower worker is measured
def test_secure_demo_survives_a_resplit_and_a_dead_worker(cluster: str) -> None:
    """The split moves (a re-split away from the slow worker-2, then recovery without it, which hands
    worker-2's stage index to another device): the broker must follow, or the run stalls on refused
    activations and gradients."""
    train = TrainConfig(epochs=2)
    config = CentralConfig(
        cluster=cluster, train=train, progress=False, repartition_first=10, chain_every=20, global_every=40
    )
    report = run_demo(
        config,
        workers=2,
        slowdowns=[1.0, 1.0, 4.0],
        broker=None,
        show_progress=False,
        kills={"worker-2": 60},
        secure=True,
    )
    assert report.epochs == 2
    assert len(report.recoveries) == 1
    assert len({tuple(p["points"]) for p in report.partitions}) >= 2  # the split really moved
    assert report.final_accuracy > 0.5


@pytest.fixture
def mosquitto_with_logins(tmp_path: Path, cluster: str) -> Iterator[tuple[str, dict[str, str]]]:
    if shutil.which("mosquitto") is None:
        pytest.skip("the mosquitto binary is not installed")
    credentials = tmp_path / "credentials"
    devices = ["central", "worker-1", "worker-2"]
    logins = throwaway_logins(str(credentials), cluster, devices, str(tmp_path))
    extra = (
        "user root\n"  # pytest's temporary directories are 0700: stay root to read the files
        f"password_file {credentials / 'mosquitto.passwd'}\nacl_file {credentials / 'mosquitto.acl'}\n"
    )
    proc = MosquittoProcess(tmp_path, extra=extra, anonymous=False).start()
    try:
        yield proc.url, logins
    finally:
        proc.stop()


def test_demo_on_mosquitto_with_per_device_logins(
    mosquitto_with_logins: tuple[str, dict[str, str]], cluster: str
) -> None:
    url, logins = mosquitto_with_logins
    assert all(os.stat(path).st_mode & 0o777 == 0o600 for path in logins.values())
    config = CentralConfig(cluster=cluster, train=TrainConfig(epochs=3), progress=False)
    report = run_demo(config, workers=2, slowdowns=[], broker=url, show_progress=False, logins=logins)
    assert report.epochs == 3
    assert report.final_accuracy >= 0.85, report.test_accuracy_per_epoch
    assert report.recoveries == []
