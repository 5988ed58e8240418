"""The role runtime every role and every training mode shares: the inbox and its limits, typed messages
out, handlers per message type and one waiting primitive, status, heartbeats and metrics."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from apscheduler.schedulers.background import BackgroundScheduler

from edgeagent.errors import ProtocolError, TrainingError
from edgeagent.protocol.identity import StageSenders, identity_problem
from edgeagent.protocol.limits import (
    INVALID,
    MALFORMED,
    NONFINITE,
    SENDER,
    TOPIC,
    InboxGate,
    InboxLimits,
    Verdict,
    nonfinite_problem,
)
from edgeagent.protocol.messages import Heartbeat, Message, Metrics, Status, StatusState
from edgeagent.protocol.topics import Family, TopicInfo, Topics
from edgeagent.protocol.wire import decode, encode
from edgeagent.runtime.compute import TimeAccount
from edgeagent.runtime.health import read_health
from edgeagent.transport.base import Transport

if TYPE_CHECKING:
    from edgeagent.transport.access import Access

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
F = TypeVar("F")


def _a(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


@dataclass(frozen=True)
class Inbound:
    """A decoded message with where it came from (``wire_topic``: the topic string; ``size``: bytes)."""

    topic: TopicInfo
    sender: str
    message: Message
    wire_topic: str = field(default="", compare=False)
    size: int = field(default=0, compare=False)


Handler = Callable[[Inbound], None]


class Role:
    """Decodes everything it subscribes to on the network thread and queues it for the role's own thread.

    Malformed payloads, unknown topics, payloads over the size limit of their topic, floods (a rate
    limit per topic), messages on a device's topic that do not come from that device or speak for
    another one (:func:`~edgeagent.protocol.identity.identity_problem`) and messages for which the
    inbox has no room are logged (rate limited) and dropped here, so the training loop only ever sees
    well-typed messages and nothing is buffered without bound; see :mod:`edgeagent.protocol.limits` and
    ``limits``. Stage outputs from a device that does not hold the stage in the run's current plan are
    dropped the same way when they are dispatched (``senders``).
    """

    def __init__(
        self, transport: Transport, topics: Topics, device_id: str, *, limits: InboxLimits | None = None
    ) -> None:
        self.transport = transport
        self.topics = topics
        self.device_id = device_id
        self.inbox: queue.Queue[Inbound] = queue.Queue()  # bounded by the gate, not by the queue
        self.gate = InboxGate(limits, name=device_id)
        self.clock: Callable[[], float] = time.monotonic  # the gate's clock (tests set their own)
        self.dropped = 0
        self._heartbeat_seq = 0
        self._scheduler: BackgroundScheduler | None = None
        self.heartbeat_interval = 1.0
        self._status = Status(device_id=device_id, state="online")
        self.times = TimeAccount()
        self._metrics_snapshot: Callable[[], dict[str, Any] | None] | None = None
        self._handlers: dict[type[Message], Handler] = {}
        # Whose stage outputs are taken: the run in progress sets ``senders.plan`` (protocol/identity.py).
        self.senders = StageSenders()

    # -- receiving -----------------------------------------------------------------------------

    def listen(self, pattern: str) -> None:
        self.transport.subscribe(pattern, self._on_payload)

    def stop_listening(self, pattern: str) -> None:
        self.transport.unsubscribe(pattern)

    def _on_payload(self, topic: str, payload: bytes) -> None:
        accepted = self._accept(topic, payload, queued=True)
        if accepted is None:
            return
        info, sender, message = accepted
        self.on_arrival(sender, message)
        verdict = self.gate.enqueue(topic, len(payload), self.clock())
        if not verdict.accepted:
            self._dropped(verdict)
            return
        self.inbox.put(Inbound(info, sender, message, wire_topic=topic, size=len(payload)))

    def _accept(self, topic: str, payload: bytes, *, queued: bool) -> tuple[TopicInfo, str, Message] | None:
        """Parse, limit (before decoding: cheap), decode and check the sender of a payload; None: dropped."""
        now = self.clock()
        try:
            info = self.topics.parse(topic)
        except ProtocolError as exc:
            detail = f"dropped a {len(payload)}-byte message on {topic}: {exc}"
            self._dropped(self.gate.reject(topic, TOPIC, detail, now))
            return None
        verdict = self.gate.admit(topic, info.family, len(payload), now, queued=queued)
        if not verdict.accepted:
            self._dropped(verdict)
            return None
        try:
            sender, message = decode(payload)
        except (ProtocolError, ValueError, TypeError, OverflowError) as exc:  # the latter: decoder bugs
            detail = f"dropped a {len(payload)}-byte message on {topic}: {exc}"
            self._dropped(self.gate.reject(topic, MALFORMED, detail, now))
            return None
        problem = identity_problem(info, sender, message)
        if problem is not None:
            detail = f"dropped {_a(message.KIND.value)} message on {topic}: {problem}"
            self._dropped(self.gate.reject(topic, SENDER, detail, now))
            return None
        problem = nonfinite_problem(message)
        if problem is not None:
            detail = f"dropped {_a(message.KIND.value)} message from {sender!r} on {topic}: {problem}"
            self._dropped(self.gate.reject(topic, NONFINITE, detail, now))
            self.on_nonfinite(sender, message, problem)
            return None
        return info, sender, message

    def discard(self, item: Inbound, reason: str) -> None:
        """Drop a well-formed message that does not fit the run: counted in ``dropped`` and logged as the
        limits allow (a flood of them must not flood the log either)."""
        topic = item.wire_topic or item.topic.family.value
        detail = f"dropped {_a(item.message.KIND.value)} message from {item.sender!r} on {topic}: {reason}"
        self._dropped(self.gate.reject(topic, INVALID, detail, self.clock()))

    def refuse(self, item: Inbound, reason: str) -> None:
        """Drop a message whose sender may not have sent it (it does not hold the stage, say): counted as a
        ``sender`` drop and logged as the limits allow."""
        topic = item.wire_topic or item.topic.family.value
        detail = f"dropped {_a(item.message.KIND.value)} message from {item.sender!r} on {topic}: {reason}"
        self._dropped(self.gate.reject(topic, SENDER, detail, self.clock()))

    def report_drops(self) -> None:
        """Log, once, how many messages were dropped so far and why (the lines about single drops are
        rate limited: this total is the one complete account), if any were."""
        drops = self.gate.drops
        if self.dropped:
            reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(drops.items()))
            log.warning("%s: %d messages dropped so far (%s)", self.device_id, self.dropped, reasons)

    def _dropped(self, verdict: Verdict) -> None:
        if verdict.log is not None:  # logged first: whoever sees the count also finds the line
            log.warning("%s", verdict.log)
        self.dropped += 1

    def on_nonfinite(self, sender: str, message: Message, problem: str) -> None:
        """Called on the network thread for a message dropped because a tensor in it is not finite
        (after the line about it is logged and the drop counted): the roles tell who sent it to whoever
        must stop a run that such a device keeps poisoning (the central node)."""

    def on_arrival(self, sender: str, message: Message) -> None:
        """Called on the network thread for every well-formed message the limits accept (size, rate,
        sender, room in the inbox when it arrived), before it is queued.

        Liveness must not depend on how busy the role's own thread is: a heartbeat that waits in the
        queue behind a long computation would make a healthy device look dead.
        """

    def next_message(self, timeout: float | None) -> Inbound | None:
        for line in self.gate.flush(self.clock()):  # summaries of drops no line has reported yet
            log.warning("%s", line)
        if timeout == 0:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return None
        else:
            started = time.perf_counter()
            try:
                item = self.inbox.get(timeout=timeout)
            except queue.Empty:
                return None
            finally:
                self.times.idle += time.perf_counter() - started
        self.times.received_bytes += item.size
        self.gate.release(item.wire_topic, item.size)
        return item

    # -- handling: one handler per message type, one way to wait ------------------------------

    def on(self, kind: type[M], handler: Callable[[Inbound], None]) -> None:
        """Handle every message of type ``kind`` (and of its subclasses: each command) with ``handler``.

        A later registration for the same type replaces the earlier one: a training mode installs its
        data plane's handlers over the role's own.
        """
        self._handlers[kind] = handler

    def off(self, kind: type[Message]) -> None:
        """Stop handling messages of type ``kind`` (a run's handlers, when the run ends); no-op if none."""
        self._handlers.pop(kind, None)

    def dispatch(self, item: Inbound) -> None:
        """Give ``item`` to the handler of its type (the most specific registered); ignore it if none.

        A stage output from a device that does not hold the stage in the current plan is refused first:
        checked here, on the role's thread, in order with the messages that change the plan."""
        problem = self.senders.problem(item.topic, item.message)
        if problem is not None:
            self.refuse(item, problem)
            return
        for cls in type(item.message).__mro__:
            handler = self._handlers.get(cls)
            if handler is not None:
                handler(item)
                return
        log.debug("%s ignores %s on %s", self.device_id, item.message.KIND.value, item.wire_topic)

    def pump(self, timeout: float) -> bool:
        """Handle every queued message, waiting up to ``timeout`` s for the first; True if any came."""
        item = self.next_message(timeout)
        if item is None:
            return False
        while item is not None:
            self.dispatch(item)
            item = self.next_message(0)
        return True

    def wait_until(
        self,
        done: Callable[[], bool],
        timeout: float,
        what: str | Callable[[], str],
        *,
        fault: Callable[[], F | None] | None = None,
        poll: float = 0.2,
        expired: Callable[[str], F] | None = None,
    ) -> F | None:
        """Handle messages until ``done()`` holds (returns None) or ``fault()`` finds one (returns it).

        The one waiting primitive of every role: handlers change the state that ``done`` and ``fault``
        look at. After ``timeout`` seconds ``what`` (or what ``what()`` returns then) did not happen: with
        ``expired``, that is a fault too (``expired(why)`` is returned: a mid-run wait that runs out is
        recovered from), else a :class:`TrainingError` says so (set-up). Callers derive ``timeout`` from
        what was measured.
        """
        deadline = time.monotonic() + timeout
        while not done():
            if fault is not None:
                found = fault()
                if found is not None:
                    return found
            if time.monotonic() > deadline:
                told = what() if callable(what) else what
                why = f"{told} (waited {timeout:.0f} s)"
                if expired is not None:
                    return expired(why)
                raise TrainingError(why)
            self.pump(poll)
        return None

    # -- sending -------------------------------------------------------------------------------

    def send(self, topic: str, message: Message, *, retain: bool = False, qos: int = 1) -> int:
        """Encode and publish ``message``; returns the payload's size in bytes."""
        started = time.perf_counter()
        payload = encode(message, sender=self.device_id)
        self.transport.publish(topic, payload, qos=qos, retain=retain)
        self.times.communication += time.perf_counter() - started
        self.times.sent_bytes += len(payload)
        return len(payload)

    def set_status(self, state: StatusState, *, run_id: str = "", stage: int = -1, detail: str = "") -> None:
        self._status = Status(
            device_id=self.device_id, state=state, run_id=run_id, stage=stage, detail=detail
        )
        self.send(self.topics.device(Family.STATUS, self.device_id), self._status, retain=True)

    def _republish_status(self) -> None:
        self.send(self.topics.device(Family.STATUS, self.device_id), self._status, retain=True)

    @staticmethod
    def mqtt_transport(
        topics: Topics, device_id: str, access: Access, *, link_mbps: float = 0.0
    ) -> Transport:
        """The transport a role uses by default: MQTT, with its ``offline`` last will registered.

        The client id is ``ea-<cluster>-<device id>``: a broker with ``edgeagent credentials`` insists
        on it, so that no other login can take a device's session.
        """
        from edgeagent.transport.access import resolve
        from edgeagent.transport.mqtt import MqttTransport

        url, tls = resolve(access, device_id)
        return MqttTransport(
            url,
            f"ea-{topics.cluster}-{device_id}",
            will=Role.offline_will_for(topics, device_id),
            link_mbps=link_mbps,
            tls=tls,
            insecure_plaintext=access.insecure_plaintext,
        )

    @staticmethod
    def offline_will_for(topics: Topics, device_id: str) -> tuple[str, bytes]:
        """The last will: a retained ``offline`` status."""
        status = Status(device_id=device_id, state="offline")
        return topics.device(Family.STATUS, device_id), encode(status, sender=device_id)

    # -- heartbeats ----------------------------------------------------------------------------

    def start_heartbeats(self, interval: float) -> None:
        self.heartbeat_interval = interval
        self._scheduler = BackgroundScheduler(daemon=True)
        self._scheduler.add_job(
            self._beat, "interval", seconds=interval, id="heartbeat", max_instances=1, coalesce=True
        )
        self._scheduler.start()
        self.transport.on_connect(self._on_reconnect)
        self._beat()  # at once: a monitor (and the central node) sees the device before the first interval

    def _on_reconnect(self) -> None:
        self._republish_status()
        self._beat()

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
        if self._metrics_snapshot is None:
            return
        values = self._metrics_snapshot()
        if values is None or not self.transport.connected:
            return
        # Every device's time account (a mode's own figures first) and health ride along (absent health
        # fields: the board does not expose them).
        values = {**self.times.figures(), **values, "health": read_health()}
        msg = Metrics(device_id=self.device_id, values=values, run_id=self._status.run_id)
        try:
            self.send(self.topics.device(Family.METRICS, self.device_id), msg, qos=0)
        except ProtocolError as exc:  # e.g. a NaN loss: say so, keep publishing
            log.warning("%s: metrics not sent: %s", self.device_id, exc)

    def set_metrics_interval(self, interval: float) -> None:
        if self._scheduler is not None and interval > 0 and self._scheduler.get_job("metrics") is not None:
            self._scheduler.reschedule_job("metrics", trigger="interval", seconds=interval)

    def set_heartbeat_interval(self, interval: float) -> None:
        changed = interval != self.heartbeat_interval
        self.heartbeat_interval = interval
        if self._scheduler is not None:
            self._scheduler.reschedule_job("heartbeat", trigger="interval", seconds=interval)
            if changed:  # at once: the central node judges this device's silence by the interval it says
                self._beat()

    def _beat(self) -> None:
        if not self.transport.connected:
            return
        self._heartbeat_seq += 1
        beat = Heartbeat(
            device_id=self.device_id,
            seq=self._heartbeat_seq,
            run_id=self._status.run_id,
            stage=self._status.stage,
            interval=self.heartbeat_interval,
        )
        self.send(self.topics.device(Family.HEARTBEAT, self.device_id), beat, qos=0)

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
        loop_ok = getattr(self.transport, "loop_alive", lambda: True)()
        return bool(scheduler_ok and loop_ok)

    def stop_heartbeats(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
