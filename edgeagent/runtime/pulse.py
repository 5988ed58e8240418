"""A role's pulse: its retained status, its heartbeats, its metrics, and the scheduler thread they run on.

Every device publishes these whatever its role: the central node judges a worker's liveness by its
heartbeats (at the interval each heartbeat says: a device profile may set up to 60 s), monitors list the
devices by their statuses and chart their metrics. The scheduler that beats also runs the role's
background jobs (replication, planning), off the role's own thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from apscheduler.schedulers.background import BackgroundScheduler

from edgeagent.errors import ProtocolError
from edgeagent.protocol.messages import Heartbeat, Message, Metrics, Status, StatusState
from edgeagent.protocol.topics import Family, Topics
from edgeagent.runtime.compute import TimeAccount
from edgeagent.runtime.health import read_health
from edgeagent.transport.base import Transport

log = logging.getLogger("edgeagent.runtime.role")


class PulseOwner(Protocol):
    """What the pulse needs of its role: where to publish, as whom, its time account, and its ``send``."""

    transport: Transport
    topics: Topics
    device_id: str
    times: TimeAccount

    def send(self, topic: str, message: Message, *, retain: bool = False, qos: int = 1) -> int: ...


class Pulse:
    """Status, heartbeats and metrics of one role (see the module doc); ``start`` starts the scheduler."""

    def __init__(self, owner: PulseOwner) -> None:
        self.owner = owner
        self.heartbeat_interval = 1.0
        self.status = Status(device_id=owner.device_id, state="online")
        self._heartbeat_seq = 0
        self._scheduler: BackgroundScheduler | None = None
        self._metrics_snapshot: Callable[[], dict[str, Any] | None] | None = None

    # -- status --------------------------------------------------------------------------------

    def set_status(self, state: StatusState, *, run_id: str = "", stage: int = -1, detail: str = "") -> None:
        owner = self.owner
        self.status = Status(
            device_id=owner.device_id, state=state, run_id=run_id, stage=stage, detail=detail
        )
        self._republish()

    def _republish(self) -> None:
        owner = self.owner
        owner.send(owner.topics.device(Family.STATUS, owner.device_id), self.status, retain=True)

    # -- heartbeats ----------------------------------------------------------------------------

    def start(self, interval: float) -> None:
        """Start the scheduler and beat every ``interval`` seconds (and once at once)."""
        self.heartbeat_interval = interval
        self._scheduler = BackgroundScheduler(daemon=True)
        self._scheduler.add_job(
            self._beat, "interval", seconds=interval, id="heartbeat", max_instances=1, coalesce=True
        )
        self._scheduler.start()
        self.owner.transport.on_connect(self._on_reconnect)
        self._beat()  # at once: a monitor (and the central node) sees the device before the first interval

    def _on_reconnect(self) -> None:
        self._republish()
        self._beat()

    def set_heartbeat_interval(self, interval: float) -> None:
        changed = interval != self.heartbeat_interval
        self.heartbeat_interval = interval
        if self._scheduler is not None:
            self._scheduler.reschedule_job("heartbeat", trigger="interval", seconds=interval)
            if changed:  # at once: the central node judges this device's silence by the interval it says
                self._beat()

    def _beat(self) -> None:
        owner = self.owner
        if not owner.transport.connected:
            return
        self._heartbeat_seq += 1
        beat = Heartbeat(
            device_id=owner.device_id,
            seq=self._heartbeat_seq,
            run_id=self.status.run_id,
            stage=self.status.stage,
            interval=self.heartbeat_interval,
        )
        owner.send(owner.topics.device(Family.HEARTBEAT, owner.device_id), beat, qos=0)

    def stop(self) -> None:
        """Stop the scheduler: no more heartbeats, metrics or background jobs."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None

    # -- metrics -------------------------------------------------------------------------------

    def start_metrics(self, interval: float, snapshot: Callable[[], dict[str, Any] | None]) -> None:
        """Publish ``snapshot()`` on this device's metrics topic every ``interval`` seconds (JSON)."""
        if self._scheduler is None or interval <= 0:
            return

        self._metrics_snapshot = snapshot
        self._scheduler.add_job(
            self.publish_metrics,
            "interval",
            seconds=interval,
            id="metrics",
            max_instances=1,
            coalesce=True,
            replace_existing=True,
        )

    def publish_metrics(self) -> None:
        """Publish the metrics snapshot now (also called at the end of a run: the final figures)."""
        owner = self.owner
        if self._metrics_snapshot is None:
            return
        values = self._metrics_snapshot()
        if values is None or not owner.transport.connected:
            return
        # Every device's time account (a mode's own figures first) and health ride along (absent health
        # fields: the board does not expose them).
        values = {**owner.times.figures(), **values, "health": read_health()}
        msg = Metrics(device_id=owner.device_id, values=values, run_id=self.status.run_id)
        try:
            owner.send(owner.topics.device(Family.METRICS, owner.device_id), msg, qos=0)
        except ProtocolError as exc:  # e.g. a NaN loss: say so, keep publishing
            log.warning("%s: metrics not sent: %s", owner.device_id, exc)

    def set_metrics_interval(self, interval: float) -> None:
        if self._scheduler is not None and interval > 0 and self._scheduler.get_job("metrics") is not None:
            self._scheduler.reschedule_job("metrics", trigger="interval", seconds=interval)

    # -- the scheduler's other jobs ------------------------------------------------------------

    def run_soon(self, func: Callable[..., object], *args: object) -> None:
        """Run ``func(*args)`` on the scheduler's thread (replication, planning) or here if there is none."""
        if self._scheduler is None:
            func(*args)
        else:
            self._scheduler.add_job(func, args=args)

    def background(self, func: Callable[[], object], job_id: str) -> bool:
        """Run ``func`` on the scheduler's thread (a planning job), replacing a pending job of the same id;
        False (and nothing runs) if the role has no scheduler."""
        if self._scheduler is None:
            return False
        self._scheduler.add_job(func, id=job_id, replace_existing=True)
        return True

    def healthy(self) -> bool:
        """For systemd's watchdog: the MQTT network loop and the scheduler run. Not whether the broker is
        reachable: during a broker outage the loop keeps reconnecting by itself, and a restart by the
        watchdog would only throw the role's state away (the central node's run, issue 49) and come back
        to the same outage."""
        scheduler_ok = self._scheduler is not None and self._scheduler.running
        loop_ok = getattr(self.owner.transport, "loop_alive", lambda: True)()
        return bool(scheduler_ok and loop_ok)


__all__ = ["Pulse", "PulseOwner"]
