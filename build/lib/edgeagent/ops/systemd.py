"""systemd's notify protocol (``Type=notify``): READY, STATUS and WATCHDOG only while healthy.

The protocol is one datagram to the Unix socket in ``$NOTIFY_SOCKET`` (``@`` means the abstract
namespace), so it is written here rather than pulled in: the small PyPI clients are unmaintained and
``systemd-python`` needs libsystemd's headers on every Pi.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Notifier:
    """Sends notifications when run under systemd; does nothing otherwise."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        self.ready_sent = False

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *fields: str) -> bool:
        if not self.enabled:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(target)
                sock.sendall("\n".join(fields).encode())
        except OSError as exc:
            log.warning("cannot notify systemd at %s: %s", self.address, exc)
            return False
        return True

    def ready(self, status: str) -> None:
        """READY=1 exactly once."""
        if not self.ready_sent and self.send("READY=1", f"STATUS={status}"):
            self.ready_sent = True

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")


def watchdog_interval() -> float | None:
    """Half of ``$WATCHDOG_USEC`` in seconds (systemd's advice), or None when no watchdog is set."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec or (os.environ.get("WATCHDOG_PID") and os.environ["WATCHDOG_PID"] != str(os.getpid())):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None


class Watchdog:
    """Pets systemd's watchdog every ``interval`` seconds while ``healthy()`` says so.

    When the MQTT loop is stuck or the scheduler stopped, the pets stop and systemd restarts the
    service after ``WatchdogSec``, which a role cannot do for itself.
    """

    def __init__(self, notifier: Notifier, healthy: Callable[[], bool], interval: float) -> None:
        self.notifier = notifier
        self.healthy = healthy
        self.interval = interval
        self.pets = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                ok = self.healthy()
            except Exception:  # a broken health check counts as unhealthy
                ok = False
            if ok and self.notifier.send("WATCHDOG=1"):
                self.pets += 1
