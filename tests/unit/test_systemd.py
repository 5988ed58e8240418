"""The notify protocol against a fake NOTIFY_SOCKET: READY once, WATCHDOG only while healthy."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeagent.broker import EmbeddedBroker
from edgeagent.config import WorkerConfig
from edgeagent.modes import mode
from edgeagent.ops import shipped
from edgeagent.ops.systemd import Notifier, Watchdog, watchdog_interval
from edgeagent.roles.worker import Worker


class FakeSystemd:
    """A datagram socket where systemd would listen; collects what the service says."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)
        self.messages: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue

    def count(self, field: str) -> int:
        return sum(field in m.split("\n") for m in list(self.messages))

    def wait_for(self, field: str, n: int = 1, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.count(field) >= n:
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeSystemd]:
    f = FakeSystemd(tmp_path / "notify.sock")
    yield f
    f.close()


def test_ready_is_sent_once(fake: FakeSystemd) -> None:
    notifier = Notifier(str(fake.path))
    notifier.ready("up")
    notifier.ready("up again")
    notifier.status("training")
    assert fake.wait_for("STATUS=training")
    assert fake.count("READY=1") == 1


def test_no_socket_means_no_notifications(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not Notifier().enabled
    assert Notifier().send("READY=1") is False


def test_watchdog_pets_only_while_healthy(fake: FakeSystemd) -> None:
    healthy = threading.Event()
    healthy.set()
    dog = Watchdog(Notifier(str(fake.path)), healthy.is_set, 0.02).start()
    try:
        assert fake.wait_for("WATCHDOG=1", n=3)
        healthy.clear()
        time.sleep(0.1)  # let a pet that was already under way land
        before = fake.count("WATCHDOG=1")
        time.sleep(0.3)  # many intervals: none may come now
        assert fake.count("WATCHDOG=1") == before
    finally:
        dog.stop()


def test_watchdog_interval_is_half_of_watchdog_usec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", "1")  # meant for another process
    assert watchdog_interval() is None


def test_worker_stops_petting_when_its_mqtt_loop_is_stuck(
    fake: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(fake.path))
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # pet every 0.05 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    with EmbeddedBroker() as broker:
        worker = Worker(WorkerConfig(broker=broker.url, cluster="notify", device_id="w1"), modes=mode)
        thread = threading.Thread(target=worker.serve, daemon=True)
        thread.start()
        try:
            assert fake.wait_for("READY=1")
            assert fake.wait_for("WATCHDOG=1", n=3)
            worker.transport.kill()  # type: ignore[attr-defined]  # the network loop dies
            time.sleep(0.2)
            before = fake.count("WATCHDOG=1")
            time.sleep(0.5)
            assert fake.count("WATCHDOG=1") == before
            assert fake.count("READY=1") == 1
        finally:
            worker.stop()
            thread.join(10)


def test_a_broker_outage_does_not_stop_the_pets(fake: FakeSystemd, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pets stopped while the broker was unreachable: an outage longer than WatchdogSec made systemd kill
    a role whose network loop was reconnecting by itself (the central node: its run with it). The loop
    and the scheduler still run: the pets go on."""
    monkeypatch.setenv("NOTIFY_SOCKET", str(fake.path))
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # pet every 0.05 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    broker = EmbeddedBroker().start()
    worker = Worker(WorkerConfig(broker=broker.url, cluster="notify", device_id="w2"), modes=mode)
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    try:
        assert fake.wait_for("READY=1")
        broker.stop()
        deadline = time.monotonic() + 10
        while worker.transport.connected:  # the outage has reached the worker
            assert time.monotonic() < deadline, "the worker never saw the broker go"
            time.sleep(0.02)
        before = fake.count("WATCHDOG=1")
        assert fake.wait_for("WATCHDOG=1", n=before + 5, timeout=5)
        assert not worker.transport.connected
    finally:
        worker.stop()
        thread.join(10)


UNITS = sorted(shipped.UNITS.glob("*.service"))


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_units_verify(unit: Path, tmp_path: Path) -> None:
    import shutil
    import subprocess

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    text = unit.read_text()
    assert "Restart=on-failure" in text and "DynamicUser=yes" in text
    # Its own state directory (a dynamic user owns one), the working directory for relative paths.
    assert f"StateDirectory={unit.stem}\n" in text and f"WorkingDirectory=%S/{unit.stem}\n" in text
    for key in ("Type=notify", "WatchdogSec=", "MemoryMax=", "SystemCallFilter=@system-service"):
        assert f"\n{key}" in text, key
    # torch's oneDNN needs writable executable memory: only the broker (no torch) takes it.
    assert ("\nMemoryDenyWriteExecute=yes" in text) == (unit.stem == "edgeagent-broker")
    # The installed command does not exist on this machine: point ExecStart at one that does.
    local = tmp_path / unit.name
    local.write_text(text.replace("/opt/edgeagent/venv/bin/edgeagent", str(shutil.which("true"))))
    proc = subprocess.run([analyze, "verify", str(local)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr


def test_central_says_ready_and_status_per_epoch_and_stopping(
    fake: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The central node's unit is Type=notify too: READY once connected, STATUS per epoch, STOPPING."""
    from edgeagent.config import CentralConfig, TrainConfig
    from edgeagent.roles.central import Central

    monkeypatch.setenv("NOTIFY_SOCKET", str(fake.path))
    monkeypatch.setenv("WATCHDOG_USEC", "100000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    with EmbeddedBroker() as broker:
        config = CentralConfig(
            broker=broker.url,
            cluster="notify-central",
            workers=0,
            progress=False,
            train=TrainConfig(epochs=2),
        )
        report = Central(config, modes=mode).run()
    assert report.epochs == 2
    assert fake.count("READY=1") == 1
    assert fake.wait_for("STOPPING=1")
    statuses = [m for m in fake.messages if "epoch 1 test accuracy" in m]
    assert statuses, fake.messages


def test_the_broker_says_ready_pets_while_its_loop_answers_and_says_stopping(fake: FakeSystemd) -> None:
    """``edgeagent broker`` (its unit is Type=notify): READY once listening, WATCHDOG while the event loop
    answers, STOPPING on SIGTERM; a loop stuck in a callback is not alive."""
    import os
    import signal
    import subprocess
    import sys

    from edgeagent.broker.embedded import free_port

    env = {**os.environ, "NOTIFY_SOCKET": str(fake.path), "WATCHDOG_USEC": "100000"}
    env.pop("WATCHDOG_PID", None)
    program = Path(sys.executable).with_name("edgeagent")
    proc = subprocess.Popen([str(program), "broker", "--port", str(free_port())], env=env)
    try:
        assert fake.wait_for("READY=1", timeout=30)
        assert fake.wait_for("WATCHDOG=1", n=3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert fake.wait_for("STOPPING=1")
    finally:
        proc.kill()
        proc.wait(10)
    with EmbeddedBroker() as broker:
        assert broker.alive()
        assert broker._loop is not None
        release = threading.Event()
        broker._loop.call_soon_threadsafe(release.wait, 5)  # a callback that blocks the loop
        try:
            assert not broker.alive(0.3)
        finally:
            release.set()
        assert broker.alive()
    assert not broker.alive()
