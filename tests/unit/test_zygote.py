"""The tests' fork server (tests/zygote.py): its workers behave as subprocess.Popen children do."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.zygote import Forked, Zygote, spawn

EDGEAGENT = [sys.executable, "-m", "edgeagent"]


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    yield z
    z.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_forked_command_writes_to_the_tests_streams_and_exits_with_its_code(
    zygote: Zygote, capfd: pytest.CaptureFixture[str]
) -> None:
    proc = zygote.spawn([*EDGEAGENT, "--version"], dict(os.environ))
    assert isinstance(proc, Forked) and proc.pid != zygote.proc.pid
    assert proc.wait(60) == 0
    assert "version" in capfd.readouterr().out
    bad = zygote.spawn([*EDGEAGENT, "no-such-command"], dict(os.environ))
    assert bad.wait(60) == 2  # click's usage error
    assert "no-such-command" in capfd.readouterr().err


def test_a_killed_worker_reports_the_signal_and_stays_reapable_until_waited(zygote: Zygote) -> None:
    broker = f"mqtt://127.0.0.1:{closed_port()}"  # nobody listens: the worker retries until killed
    cmd = [*EDGEAGENT, "worker", "--device-id", "w", "--broker", broker, "--cluster", "zygote-test"]
    proc = zygote.spawn(cmd, dict(os.environ))
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.2)
    assert proc.poll() is None
    os.kill(proc.pid, signal.SIGKILL)
    os.kill(proc.pid, signal.SIGKILL)  # a zombie until reaped, as a Popen child: no error
    assert proc.wait(60) == -signal.SIGKILL
    assert proc.poll() == -signal.SIGKILL
    proc.kill()  # reaped: nothing is signalled


def test_what_a_fork_cannot_copy_gets_a_real_process(zygote: Zygote) -> None:
    env = dict(os.environ)
    assert zygote.usable([*EDGEAGENT, "worker"], env)
    assert not zygote.usable([*EDGEAGENT, "worker"], dict(env, PYTHONPATH="/elsewhere"))
    assert not zygote.usable([*EDGEAGENT, "worker"], dict(env, OMP_NUM_THREADS="7"))
    assert not zygote.usable(["/bin/true"], env)
    proc = spawn([sys.executable, "-c", "pass"], env)
    assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 0
