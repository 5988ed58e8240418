"""The shipped systemd units verify with ``systemd-analyze``; ``edgeagent broker`` as a real process speaks
the notify protocol (READY, WATCHDOG, STOPPING) to a fake NOTIFY_SOCKET."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from edgeagent.broker import EmbeddedBroker
from edgeagent.ops import shipped
from tests.helpers import FakeSystemd

UNITS = sorted(shipped.UNITS.glob("*.service"))


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_units_verify(unit: Path, tmp_path: Path) -> None:

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


def test_the_broker_says_ready_pets_while_its_loop_answers_and_says_stopping(
    fake_systemd: FakeSystemd,
) -> None:
    """``edgeagent broker`` (its unit is Type=notify): READY once listening, WATCHDOG while the event loop
    answers, STOPPING on SIGTERM; a loop stuck in a callback is not alive."""
    import subprocess

    from edgeagent.broker.embedded import free_port

    env = {**os.environ, "NOTIFY_SOCKET": str(fake_systemd.path), "WATCHDOG_USEC": "100000"}
    env.pop("WATCHDOG_PID", None)
    program = Path(sys.executable).with_name("edgeagent")
    proc = subprocess.Popen([str(program), "broker", "--port", str(free_port())], env=env)
    try:
        assert fake_systemd.wait_for("READY=1", timeout=30)
        assert fake_systemd.wait_for("WATCHDOG=1", n=3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert fake_systemd.wait_for("STOPPING=1")
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
