"""The notify protocol against a fake NOTIFY_SOCKET: READY once, WATCHDOG only while healthy."""

from __future__ import annotations

import threading
import time

import pytest

from edgeagent.broker import EmbeddedBroker
from edgeagent.config import WorkerConfig
from edgeagent.modes import mode
from edgeagent.ops import shipped
from edgeagent.ops.systemd import Notifier, Watchdog, watchdog_interval
from edgeagent.roles.worker import Worker
from tests.helpers import FakeSystemd


def test_ready_is_sent_once(fake_systemd: FakeSystemd) -> None:
    notifier = Notifier(str(fake_systemd.path))
    notifier.ready("up")
    notifier.ready("up again")
    notifier.status("training")
    assert fake_systemd.wait_for("STATUS=training")
    assert fake_systemd.count("READY=1") == 1


def test_no_socket_means_no_notifications(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not Notifier().enabled
    assert Notifier().send("READY=1") is False


def test_watchdog_pets_only_while_healthy(fake_systemd: FakeSystemd) -> None:
    healthy = threading.Event()
    healthy.set()
    dog = Watchdog(Notifier(str(fake_systemd.path)), healthy.is_set, 0.02).start()
    try:
        assert fake_systemd.wait_for("WATCHDOG=1", n=3)
        healthy.clear()
        time.sleep(0.1)  # let a pet that was already under way land
        before = fake_systemd.count("WATCHDOG=1")
        time.sleep(0.3)  # many intervals: none may come now
        assert fake_systemd.count("WATCHDOG=1") == before
    finally:
        dog.stop()


def test_watchdog_interval_is_half_of_watchdog_usec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", "1")  # meant for another process
    assert watchdog_interval() is None


def test_worker_stops_petting_when_its_mqtt_loop_is_stuck(
    fake_systemd: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(fake_systemd.path))
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # pet every 0.05 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    with EmbeddedBroker() as broker:
        worker = Worker(WorkerConfig(broker=broker.url, cluster="notify", device_id="w1"), modes=mode)
        thread = threading.Thread(target=worker.serve, daemon=True)
        thread.start()
        try:
            assert fake_systemd.wait_for("READY=1")
            assert fake_systemd.wait_for("WATCHDOG=1", n=3)
            worker.transport.kill()  # type: ignore[attr-defined]  # the network loop dies
            time.sleep(0.2)
            before = fake_systemd.count("WATCHDOG=1")
            time.sleep(0.5)
            assert fake_systemd.count("WATCHDOG=1") == before
            assert fake_systemd.count("READY=1") == 1
        finally:
            worker.stop()
            thread.join(10)


def test_a_broker_outage_does_not_stop_the_pets(
    fake_systemd: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pets stopped while the broker was unreachable: an outage longer than WatchdogSec made systemd kill
    a role whose network loop was reconnecting by itself (the central node: its run with it). The loop
    and the scheduler still run: the pets go on."""
    monkeypatch.setenv("NOTIFY_SOCKET", str(fake_systemd.path))
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # pet every 0.05 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    broker = EmbeddedBroker().start()
    worker = Worker(WorkerConfig(broker=broker.url, cluster="notify", device_id="w2"), modes=mode)
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    try:
        assert fake_systemd.wait_for("READY=1")
        broker.stop()
        deadline = time.monotonic() + 10
        while worker.transport.connected:  # the outage has reached the worker
            assert time.monotonic() < deadline, "the worker never saw the broker go"
            time.sleep(0.02)
        before = fake_systemd.count("WATCHDOG=1")
        assert fake_systemd.wait_for("WATCHDOG=1", n=before + 5, timeout=5)
        assert not worker.transport.connected
    finally:
        worker.stop()
        thread.join(10)


UNITS = sorted(shipped.UNITS.glob("*.service"))


def test_central_says_ready_and_status_per_epoch_and_stopping(
    fake_systemd: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The central node's unit is Type=notify too: READY once connected, STATUS per epoch, STOPPING."""
    from edgeagent.config import CentralConfig, TrainConfig
    from edgeagent.roles.central import Central

    monkeypatch.setenv("NOTIFY_SOCKET", str(fake_systemd.path))
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
    assert fake_systemd.count("READY=1") == 1
    assert fake_systemd.wait_for("STOPPING=1")
    statuses = [m for m in fake_systemd.messages if "epoch 1 test accuracy" in m]
    assert statuses, fake_systemd.messages
