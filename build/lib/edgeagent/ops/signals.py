"""SIGTERM as Ctrl-C, or as a request to stop: what a command does when it is stopped (kill, a timeout,
``systemctl stop`` or ``restart``)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class StopRequested(BaseException):
    """SIGTERM asked the process to stop (``systemctl stop`` or ``restart``, say). A ``BaseException``,
    as ``KeyboardInterrupt``: no ``except Exception`` on the way swallows it."""


@contextlib.contextmanager
def _on_sigterm(handler: Any) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # off the main thread no handler can be set: the block runs unchanged
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Inside the block SIGTERM (kill, a timeout, systemd) raises ``SystemExit(143)``, so ``finally``
    clauses run as they do for Ctrl-C: child processes are stopped and cgroups removed instead of left
    behind by Python's default, which ends the process at once. The previous handler is back afterwards;
    off the main thread (where no handler can be set) the block runs unchanged."""

    def unwind(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    with _on_sigterm(unwind):
        yield


@contextlib.contextmanager
def sigterm_stops() -> Iterator[None]:
    """Inside the block the first SIGTERM raises :class:`StopRequested` in the main thread, wherever it
    is: the central node then checkpoints, says its run is suspended and exits cleanly. Later SIGTERMs
    are ignored while that happens (systemd sends one; an impatient user may send more), and SIGKILL
    after ``TimeoutStopSec`` stays the last word."""
    raised = False

    def stop(_signum: int, _frame: Any) -> None:
        nonlocal raised
        if not raised:
            raised = True
            raise StopRequested("SIGTERM")

    with _on_sigterm(stop):
        yield


__all__ = ["StopRequested", "sigterm_stops", "sigterm_unwinds"]
