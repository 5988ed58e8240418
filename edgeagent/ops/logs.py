"""Logging set-up shared by the command-line entry points."""

from __future__ import annotations

import logging

from rich.console import Console
from rich.logging import RichHandler

console = Console(stderr=True)

# Libraries that narrate every packet at INFO.
_NOISY = ("amqtt", "transitions", "apscheduler", "paho")


def setup_logging(level: str = "INFO", *, device: str = "") -> None:
    """Rich log lines on stderr (they print above progress bars); quiet third-party chatter."""
    handler = RichHandler(console=console, show_path=False, rich_tracebacks=False, markup=False)
    prefix = f"[{device}] " if device else ""
    handler.setFormatter(logging.Formatter(f"{prefix}%(message)s"))
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
