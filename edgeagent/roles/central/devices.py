"""Every device's figures as its own metrics say: the report's ``devices`` (the pipeline bubble).

Each device publishes its time account (compute, communication, idle, wall seconds) and the bytes it sent
and took in on ``device/<id>/metrics`` (:meth:`edgeagent.runtime.pulse.Pulse.publish_metrics`, every mode).
:class:`DeviceFigures` listens there on the network thread and keeps each device's latest message of the
run; at the run's end the central node waits, briefly, for the final ones its ``stop`` makes the workers
send, and :func:`device_rows` turns them into the report's rows (pure: no I/O).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from edgeagent.errors import ProtocolError
from edgeagent.protocol.messages import Metrics
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode
from edgeagent.transport.base import Transport

log = logging.getLogger("edgeagent.roles.central")

# The figures a row keeps, as the metrics name them (seconds, then bytes).
FIGURES = ("compute_s", "communication_s", "idle_s", "wall_s", "bytes_sent", "bytes_received")


class DeviceFigures:
    """The latest metrics of each device of run ``run_id`` (thread-safe: filled on the network thread)."""

    def __init__(self, transport: Transport, topics: Topics, run_id: str) -> None:
        self._topics = topics
        self.run_id = run_id
        self._changed = threading.Condition()
        self._latest: dict[str, dict[str, Any]] = {}
        self._seen: dict[str, int] = {}  # metrics messages taken per device
        transport.subscribe(topics.devices(Family.METRICS), self._on_metrics)

    def _on_metrics(self, topic: str, payload: bytes) -> None:
        try:
            device = self._topics.parse(topic).device
            _, msg = decode(payload)
        except ProtocolError as exc:
            log.debug("%s: not a metrics message: %s", topic, exc)
            return
        # A device speaks for itself only, and of this run only (a worker's last run's figures are not ours).
        if not isinstance(msg, Metrics) or device != msg.device_id or msg.run_id != self.run_id:
            return
        with self._changed:
            self._latest[device] = dict(msg.values)
            self._seen[device] = self._seen.get(device, 0) + 1
            self._changed.notify_all()

    def seen(self) -> dict[str, int]:
        with self._changed:
            return dict(self._seen)

    def latest(self) -> dict[str, dict[str, Any]]:
        with self._changed:
            return {d: dict(v) for d, v in self._latest.items()}

    def wait_newer(self, devices: Iterable[str], since: Mapping[str, int], timeout: float) -> bool:
        """Wait until every one of ``devices`` sent metrics after the counts ``since`` (:meth:`seen`), at most
        ``timeout`` seconds; whether they all did."""
        wanted = list(devices)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if all(self._seen.get(d, 0) > since.get(d, 0) for d in wanted):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return value


def device_rows(
    latest: Mapping[str, Mapping[str, Any]],
    order: list[str],
    stage_times: Mapping[str, Mapping[str, float]] | None = None,
) -> list[dict[str, Any]]:
    """One row per device, the run's devices in ``order`` first (stage 0, the central node, leading), then
    any other device of the run that sent figures (one that left it); a device that sent none is left out.

    A row holds what the device's last metrics said of ``FIGURES`` (those it sent), its ``stage`` when it
    had one, and ``predicted_stage_s`` / ``measured_stage_s`` from ``stage_times`` when the mode knows them.
    """
    rows: list[dict[str, Any]] = []
    for device in [*order, *sorted(set(latest) - set(order))]:
        values = latest.get(device)
        if values is None:
            continue
        row: dict[str, Any] = {"device": device}
        stage = values.get("stage")
        if isinstance(stage, int) and not isinstance(stage, bool):
            row["stage"] = stage
        for key in FIGURES:
            x = _number(values.get(key))
            if x is not None:
                row[key] = x
        for key, value in (stage_times or {}).get(device, {}).items():
            if _number(value) is not None:
                row[key] = value
        rows.append(row)
    return rows
