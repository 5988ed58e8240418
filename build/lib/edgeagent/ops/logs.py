"""Logging set-up shared by the command-line entry points."""

from __future__ import annotations

import logging
import os
import sys

from rich.console import Console
from rich.logging import RichHandler

console = Console(stderr=True)
# Off a terminal (journald, a pipe) console.print keeps a line whole instead of wrapping it at 80 columns.
console.soft_wrap = not console.is_terminal

# Libraries that narrate every packet at INFO.
_NOISY = ("amqtt", "transitions", "apscheduler", "paho")


def setup_logging(level: str = "INFO", *, device: str = "") -> None:
    """Rich log lines on a terminal (they print above progress bars), one plain line per record
    elsewhere; quiet third-party chatter.

    Off a terminal (journald, a pipe, a file) rich would wrap a record at 80 columns into several lines,
    and the journal would store each as a record of its own: one error, one line. Under systemd
    (``$JOURNAL_STREAM``) the journal stamps the time itself."""
    prefix = f"[{device}] " if device else ""
    handler: logging.Handler
    if console.is_terminal:
        handler = RichHandler(console=console, show_path=False, rich_tracebacks=False, markup=False)
        handler.setFormatter(logging.Formatter(f"{prefix}%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        stamp = "" if os.environ.get("JOURNAL_STREAM") else "%(asctime)s "
        handler.setFormatter(logging.Formatter(f"{stamp}%(levelname)s {prefix}%(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in _NOISY:
        logging.getLogger(name).setLevel(logging.WARNING)
    # amqtt logs every client disconnect as an error with a traceback; a dropped device is normal here.
    logging.getLogger("amqtt.broker").setLevel(logging.CRITICAL)
    # A heartbeat that waits behind a large message on a slow link makes APScheduler skip the next
    # one and warn; the central node allows for that (see Central._transfer_slack).
    logging.getLogger("apscheduler.executors.default").setLevel(logging.ERROR)
    logging.getLogger("apscheduler.scheduler").setLevel(logging.ERROR)
