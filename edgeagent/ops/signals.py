"""SIGTERM as Ctrl-C: a command that starts processes or makes cgroups cleans up when it is stopped."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Inside the block SIGTERM (kill, a timeout, systemd) raises ``SystemExit(143)``, so ``finally``
    clauses run as they do for Ctrl-C: child processes are stopped and cgroups removed instead of left
    behind by Python's default, which ends the process at once. The previous handler is back afterwards;
    off the main thread (where no handler can be set) the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["sigterm_unwinds"]
