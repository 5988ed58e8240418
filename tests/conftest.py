"""Shared fixtures: real brokers on free ephemeral ports (embedded amqtt and Mosquitto)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeagent.broker import EmbeddedBroker
from edgeagent.broker.mosquitto import MosquittoProcess, wait_listening
from edgeagent.cli.demo import LocalWorkers
from tests import zygote
from tests.helpers import FakeSystemd, unique_cluster


def _wait_port(port: int, timeout: float = 10.0) -> bool:
    return wait_listening(port, timeout=timeout)


@pytest.fixture(autouse=True, scope="session")
def _forked_workers() -> Iterator[None]:
    """The workers the tests start (LocalWorkers) are forks of one process that imported torch once
    (tests/zygote.py): 1.8 s of CPU less per worker. EDGEAGENT_TEST_FORK=0 starts each afresh."""
    if os.environ.get("EDGEAGENT_TEST_FORK", "1") == "0":
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LocalWorkers, "spawn", staticmethod(zygote.spawn))
        yield
    zygote.close()


@pytest.fixture(autouse=True)
def _private_state_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``edgeagent central`` checkpoints by default in the state directory and resumes the latest run it
    finds there: each test (and the processes it starts) gets its own, never the user's
    ~/.local/state/edgeagent, so no test resumes another's run."""
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))


@pytest.fixture
def amqtt_url() -> Iterator[str]:
    broker = EmbeddedBroker().start()
    try:
        yield broker.url
    finally:
        broker.stop()


@pytest.fixture
def mosquitto_url(tmp_path: Path) -> Iterator[str]:
    if shutil.which("mosquitto") is None:
        pytest.skip("the mosquitto binary is not installed (apt-get install mosquitto)")
    proc = MosquittoProcess(tmp_path).start()
    try:
        yield proc.url
    finally:
        proc.stop()


@pytest.fixture(params=["amqtt", "mosquitto"])
def broker_url(request: pytest.FixtureRequest) -> str:
    """Each test that takes this runs once against amqtt and once against Mosquitto."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def cluster() -> str:
    """A unique cluster name, so concurrent runs on one broker never see each other's topics."""
    return unique_cluster()


@pytest.fixture
def fake_systemd(tmp_path: Path) -> Iterator[FakeSystemd]:
    """A datagram socket where systemd would listen (pass its ``path`` as NOTIFY_SOCKET)."""
    f = FakeSystemd(tmp_path / "notify.sock")
    yield f
    f.close()


def first_pid_in(group: Path, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
    """Wait until a process has joined the cgroup ``group`` while ``proc`` (which starts it) runs; its pid."""
    procs = group / "cgroup.procs"
    deadline = time.monotonic() + timeout
    while True:
        pids = procs.read_text().split() if procs.exists() else []
        if pids:
            return int(pids[0])
        assert proc.poll() is None, f"exited with {proc.returncode} before a process joined {group}"
        assert time.monotonic() < deadline, f"no process joined {group} in {timeout:g} s"
        time.sleep(0.05)


def terminate_and_check_unwound(proc: subprocess.Popen[bytes], log: Path, child: int) -> None:
    """SIGTERM ``proc``: it must unwind as on Ctrl-C (exit 143) and take its ``child`` process with it."""
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=30)
    assert code == 128 + signal.SIGTERM, f"exit {code}; it printed:\n{log.read_text()[-3000:]}"
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
