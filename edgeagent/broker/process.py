"""The embedded broker in a process of its own (``edgeagent broker``), for the demo and benches.

Run as a thread of the central node (:class:`~edgeagent.broker.embedded.EmbeddedBroker`), amqtt's event
loop shares one GIL with stage 0's training loop and its MQTT client: a profile of the demo found 25 % of
all samples in the broker's loop, every relayed activation and gradient waiting for stage 0 to let go of
the interpreter. In its own process it has its own interpreter (and core, where there is one).

Readiness is the broker's own systemd notification (READY=1 once its listener accepts connections), sent
to a socket of ours: no polling, no fixed wait; a broker that exits before it is ready is reported with
the last lines it wrote.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgeagent.broker.embedded import BrokerAddress, BrokerTls
from edgeagent.errors import ConfigError

log = logging.getLogger(__name__)

START_TIMEOUT_S = 90.0  # the interpreter, then amqtt (its own 60 s bound): about 1 s here, a Pi 10-50x slower


class BrokerProcess(BrokerAddress):
    """``edgeagent broker`` on ``host:port`` (a free port by default) as a child process.

    ``start()`` returns once the broker says it listens; ``stop()`` asks it to stop (SIGTERM), then kills
    it if it does not within ``timeout``. Same interface as :class:`EmbeddedBroker` (``url``, ``start``,
    ``stop``, ``alive``, a context manager).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        credentials: str | None = None,
        tls: BrokerTls | None = None,
        log_level: str = "WARNING",
    ) -> None:
        super().__init__(host, port, credentials=credentials, tls=tls)
        self.log_level = log_level
        self._proc: subprocess.Popen[bytes] | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "edgeagent", "broker", "--host", self.host, "--port", str(self.port)]
        cmd += ["--log-level", self.log_level]
        if self.credentials:
            cmd += ["--credentials-dir", self.credentials]
        if self.tls is not None:
            cmd += ["--cert-file", self.tls.cert_file, "--key-file", self.tls.key_file]
            if self.tls.ca_file:
                cmd += ["--ca-file", self.tls.ca_file]
            if self.tls.require_client_cert:
                cmd += ["--require-client-cert"]
        return cmd

    def start(self, timeout: float = START_TIMEOUT_S) -> BrokerProcess:
        self._scratch = tempfile.TemporaryDirectory(prefix="edgeagent-broker-")
        address = os.path.join(self._scratch.name, "notify")
        log_path = Path(self._scratch.name) / "broker.log"
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as ready:
            ready.bind(address)
            env = {k: v for k, v in os.environ.items() if k not in ("WATCHDOG_USEC", "WATCHDOG_PID")}
            env["NOTIFY_SOCKET"] = address
            with open(log_path, "wb") as out:
                self._proc = subprocess.Popen(self.command(), env=env, stdout=out, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + timeout
            while True:
                ready.settimeout(0.2)
                with contextlib.suppress(TimeoutError):
                    if b"READY=1" in ready.recv(4096):
                        break
                code = self._proc.poll()
                if code is not None or time.monotonic() > deadline:
                    tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
                    self.stop()
                    what = f"exited with code {code}" if code is not None else f"not ready in {timeout:.0f} s"
                    raise ConfigError(f"the broker on {self.host}:{self.port} {what}: " + " | ".join(tail))
        log.info("embedded broker (process %d) listening on %s", self._proc.pid, self.url)
        return self

    def alive(self) -> bool:
        """Whether the broker process still runs."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the broker (process %d) did not stop in %.0f s; killed", proc.pid, timeout)
                proc.kill()
                proc.wait()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
