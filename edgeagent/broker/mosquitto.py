"""A private Mosquitto for benchmarks and tests: its own configuration file on a free loopback port, so the
machine's broker (if any) is never touched.

``nodelay=True`` adds ``set_tcp_nodelay true`` (what docs/brokers.md asks of a Mosquitto for edgeagent);
``nodelay=False`` leaves Nagle's algorithm on, as Debian's package configures Mosquitto.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from edgeagent.broker.embedded import free_port


def mosquitto_conf(port: int, *, nodelay: bool = True, anonymous: bool = True, extra: str = "") -> str:
    """A ``mosquitto.conf`` listening on 127.0.0.1:``port``, no persistence, errors to stderr."""
    return (
        f"listener {port} 127.0.0.1\nallow_anonymous {str(anonymous).lower()}\npersistence false\n"
        f"max_queued_messages 10000\n{'set_tcp_nodelay true' if nodelay else ''}\nlog_dest stderr\n"
        "log_type error\n" + extra
    )


def wait_listening(port: int, *, timeout: float = 10.0, proc: subprocess.Popen[bytes] | None = None) -> bool:
    """Whether something listens on 127.0.0.1:``port`` within ``timeout`` s (False at once if ``proc``
    exits first)."""
    deadline = time.monotonic() + timeout
    gate = threading.Event()  # never set: only its timed wait paces the polling
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        gate.wait(0.05)
    return False


class MosquittoProcess:
    """``mosquitto -c DIR/mosquitto-<port>.conf`` on a free port (or ``port``); a context manager."""

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        *,
        extra: str = "",
        anonymous: bool = True,
        nodelay: bool = True,
    ) -> None:
        self.port = port or free_port()
        self.nodelay = nodelay
        self.conf = Path(directory) / f"mosquitto-{self.port}.conf"
        self.conf.write_text(mosquitto_conf(self.port, nodelay=nodelay, anonymous=anonymous, extra=extra))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> MosquittoProcess:
        """Start it and wait until it listens (RuntimeError if it does not within 10 s)."""
        binary = shutil.which("mosquitto")
        if binary is None:
            raise RuntimeError("the mosquitto binary is not installed (apt-get install mosquitto)")
        self.proc = subprocess.Popen([binary, "-c", str(self.conf)], stderr=subprocess.DEVNULL)
        if not wait_listening(self.port, proc=self.proc):
            self.stop()
            raise RuntimeError(f"mosquitto did not listen on {self.port} (configuration {self.conf})")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def __enter__(self) -> MosquittoProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
