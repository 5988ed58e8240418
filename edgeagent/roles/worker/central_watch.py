"""A worker's view of its run's central node: when its status ends the run here, and when its absence
does.

Note: how a worker gets back into the run of a restarted central node (issue 49).
    A central node that is restarted resumes its own run under the same run id
    (:mod:`edgeagent.roles.central.runs`), and a resumed run always starts every stage again from the
    checkpoint: its ``Assign`` carries the checkpoint's weights and Table I state and a plan id above
    the checkpoint's, so whatever a worker still holds of the run is replaced, never merged (a worker
    takes an ``Assign`` of the run it is in as a re-assignment: it builds the new stage, then drops the
    old one). Both ways back are therefore safe, and which one a worker takes depends only on how the
    central node went away:

    * killed (SIGKILL, a crash, a power cut; the broker publishes its ``offline`` last will): the worker
      stays in the run for :data:`CENTRAL_OFFLINE_BEATS` of the central node's heartbeat interval (its
      ``Assign`` says it), at least ``central_offline_floor`` (30 s: a service restart on a Pi). A
      central node back within that window finds it busy with its own run, which its discovery accepts;
      after it the worker leaves the run and announces itself idle, which any central node accepts.
    * stopped (SIGTERM: its status says ``left`` and names the run): the run is suspended, so the worker
      leaves it at once and announces itself idle for the central node's next start.
    * a central node that goes on with another run (its status says ``training`` another run id:
      ``--fresh``, other settings) ends this one here at once, as ``idle`` always did.

    The window is not a deadline on anything the worker computes: a live central node clears it with
    any message (its status again after a reconnect, its next command or activation), and time while
    the worker itself is off the broker does not count (on reconnecting it waits for the central node's
    retained status again, which a live central node republishes whenever it reconnects).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Literal, Protocol

from edgeagent.protocol.messages import Message, Status
from edgeagent.protocol.topics import Family, Topics
from edgeagent.transport.base import Transport

log = logging.getLogger("edgeagent.roles.worker.node")

# The central node's heartbeat intervals a worker waits after its last will before it leaves the run:
# the central node's reconnect (paho's backoff, capped at 5 s) at a heartbeat of 0.5 s, and ten missed
# beats as the central node itself waits three for a worker plus its transfer slack.
CENTRAL_OFFLINE_BEATS = 10.0


@dataclass(frozen=True)
class Verdict:
    """What the central node's status means for this device's run: ``over`` (it is idle: end the run),
    or ``leave`` (suspended or another run: leave it and announce idle); ``reason`` for the log."""

    action: Literal["over", "leave"]
    reason: str


def status_verdict(msg: Status, central: str, run_id: str) -> Verdict | None:
    """What the central node ``central``'s status ``msg`` means for run ``run_id`` here (None: nothing;
    its ``offline`` last will is for :class:`CentralWatch`)."""
    if msg.device_id != central:
        return None
    if msg.state == "idle":
        return Verdict("over", f"the central node {central} is idle, so run {run_id} is over")
    if msg.state == "left" and msg.run_id in ("", run_id):
        why = msg.detail or "it stopped"
        return Verdict("leave", f"the central node {central} left run {run_id} ({why})")
    if msg.state == "training" and msg.run_id and msg.run_id != run_id:
        return Verdict("leave", f"the central node {central} now trains run {msg.run_id}, not {run_id}")
    return None


@dataclass
class CentralWatch:
    """The absence of one run's central node, measured on this device's clock (see the module's note).

    ``gone_since`` is when its last will came (or when this device reconnected: until the central
    node's status is seen again); None while it is seen alive."""

    central: str
    interval: float  # the central node's heartbeat interval (its Assign), s
    floor: float
    gone_since: float | None = None

    @property
    def window(self) -> float:
        """How long the central node may stay offline before this device leaves its run."""
        interval = self.interval if math.isfinite(self.interval) and self.interval > 0 else 0.0
        return max(self.floor, CENTRAL_OFFLINE_BEATS * interval)

    def arrived(self, sender: str, message: Message, now: float) -> None:
        """Any message from the central node is a sign of life, but for its last will."""
        if sender != self.central:
            return
        if isinstance(message, Status) and message.state == "offline":
            if self.gone_since is None:
                self.gone_since = now
            return
        self.gone_since = None

    def reconnected(self, now: float) -> None:
        """This device is back on the broker: the central node's status must be seen again (its retained
        status comes with the subscription, after this)."""
        self.gone_since = now

    def expired(self, now: float) -> float | None:
        """Seconds the central node has been gone, once that is beyond :attr:`window`; else None."""
        if self.gone_since is None or now - self.gone_since < self.window:
            return None
        return now - self.gone_since


class TrackerOwner(Protocol):
    """What the tracker needs of the worker: its name, its broker connection and its subscriptions."""

    device_id: str
    topics: Topics
    transport: Transport

    def listen(self, pattern: str) -> None: ...

    def stop_listening(self, pattern: str) -> None: ...


class CentralTracker:
    """The central node of the run this device is in: followed from its ``Assign`` until the device leaves
    the run. Its status topic is the worker's subscription as well as the session's, so that every mode's
    session hears its last will; its absence is measured by a :class:`CentralWatch` (``watch``)."""

    def __init__(self, owner: TrackerOwner, floor: float) -> None:
        self.owner = owner
        self.floor = floor  # ``central_offline_floor``: the least window, s
        self.watch: CentralWatch | None = None

    def follow(self, central: str, interval: float) -> None:
        """Whoever sent the ``Assign`` runs the run (at ``interval`` s heartbeats): watch for its absence."""
        self.watch = CentralWatch(central, interval, self.floor)
        self.owner.listen(self.owner.topics.device(Family.STATUS, central))

    def unfollow(self) -> None:
        if self.watch is not None:
            self.owner.stop_listening(self.owner.topics.device(Family.STATUS, self.watch.central))
            self.watch = None

    def arrived(self, sender: str, message: Message) -> None:
        """Network thread: a sign of life of the run's central node clears its absence at once, however
        long the loop is busy with a batch."""
        watch = self.watch
        if watch is not None:
            watch.arrived(sender, message, time.monotonic())

    def reconnected(self) -> None:
        """Network thread, before the retained statuses of the subscriptions arrive."""
        watch = self.watch
        if watch is not None:
            watch.reconnected(time.monotonic())

    def gone(self, run_id: str) -> bool:
        """Whether the central node of run ``run_id`` has been offline longer than its window (said in the
        log); never while this device is itself off the broker."""
        watch = self.watch
        if watch is None or not self.owner.transport.connected:
            return False
        gone = watch.expired(time.monotonic())
        if gone is None:
            return False
        log.warning(
            "%s: the central node %s of run %s has been offline for %.1f s (window %.1f s: %g of its "
            "%.2f s heartbeats, at least %.0f s); leaving the run and announcing this device idle",
            self.owner.device_id,
            watch.central,
            run_id,
            gone,
            watch.window,
            CENTRAL_OFFLINE_BEATS,
            watch.interval,
            watch.floor,
        )
        return True

    def status(self, msg: Status, central: str, run_id: str) -> Verdict | None:
        """What the central node's status means for run ``run_id`` (:func:`status_verdict`), logged."""
        verdict = status_verdict(msg, central, run_id)
        if verdict is not None:
            log.warning("%s: %s; leaving the run", self.owner.device_id, verdict.reason)
        return verdict


__all__ = [
    "CENTRAL_OFFLINE_BEATS",
    "CentralTracker",
    "CentralWatch",
    "TrackerOwner",
    "Verdict",
    "status_verdict",
]
