"""What the central node and the workers share: the inbox, typed messages out, status and heartbeats."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from apscheduler.schedulers.background import BackgroundScheduler

from edgeagent.errors import ProtocolError, TrainingError
from edgeagent.protocol.limits import (
    INVALID,
    MALFORMED,
    SENDER,
    TOPIC,
    InboxGate,
    InboxLimits,
    Verdict,
    sender_problem,
)
from edgeagent.protocol.messages import Heartbeat, Message, Metrics, Probe, Status, decode, encode
from edgeagent.protocol.topics import Family, TopicInfo, Topics
from edgeagent.transport.base import Transport

if TYPE_CHECKING:
    from edgeagent.transport.access import Access

log = logging.getLogger(__name__)


def _a(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


@dataclass
class TimeAccount:
    """Where a role's time went: compute (emulated), communication (encoding and publishing), idle."""

    compute: float = 0.0
    communication: float = 0.0
    idle: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def reset(self) -> None:
        self.compute = self.communication = self.idle = 0.0
        self.started = time.perf_counter()

    def summary(self) -> dict[str, float]:
        wall = time.perf_counter() - self.started
        return {"wall": wall, "compute": self.compute, "communication": self.communication, "idle": self.idle}


@dataclass(frozen=True)
class Inbound:
    """A decoded message with where it came from (``wire_topic``: the topic string; ``size``: bytes)."""

    topic: TopicInfo
    sender: str
    message: Message
    wire_topic: str = field(default="", compare=False)
    size: int = field(default=0, compare=False)


class Role:
    """Decodes everything it subscribes to on the network thread and queues it for the role's own thread.

    Malformed payloads, unknown topics, payloads over the size limit of their topic, floods (a rate
    limit per topic), messages on another device's topic that do not come from that device and
    messages for which the inbox has no room are logged (rate limited) and dropped here, so the
    training loop only ever sees well-typed messages and nothing is buffered without bound; see
    :mod:`edgeagent.protocol.limits` and ``limits``.
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
        problem = sender_problem(info, sender)
        if problem is not None:
            detail = f"dropped {_a(message.KIND.value)} message on {topic}: {problem}"
            self._dropped(self.gate.reject(topic, SENDER, detail, now))
            return None
        return info, sender, message

    def discard(self, item: Inbound, reason: str) -> None:
        """Drop a well-formed message that does not fit the run: counted in ``dropped`` and logged as the
        limits allow (a flood of them must not flood the log either)."""
        topic = item.wire_topic or item.topic.family.value
        detail = f"dropped {_a(item.message.KIND.value)} message from {item.sender!r} on {topic}: {reason}"
        self._dropped(self.gate.reject(topic, INVALID, detail, self.clock()))

    def report_drops(self) -> None:
        """Log, once, how many messages were dropped so far and why (the lines about single drops are
        rate limited: this total is the one complete account), if any were."""
        drops = self.gate.drops
        if self.dropped:
            reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(drops.items()))
            log.warning("%s: %d messages dropped so far (%s)", self.device_id, self.dropped, reasons)

    def _dropped(self, verdict: Verdict) -> None:
        self.dropped += 1
        if verdict.log is not None:
            log.warning("%s", verdict.log)

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
        self.gate.release(item.wire_topic, item.size)
        return item

    # -- sending -------------------------------------------------------------------------------

    def send(self, topic: str, message: Message, *, retain: bool = False, qos: int = 1) -> int:
        """Encode and publish ``message``; returns the payload's size in bytes."""
        started = time.perf_counter()
        payload = encode(message, sender=self.device_id)
        self.transport.publish(topic, payload, qos=qos, retain=retain)
        self.times.communication += time.perf_counter() - started
        return len(payload)

    def set_status(self, state: str, *, run_id: str = "", stage: int = -1, detail: str = "") -> None:
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
        self.transport.on_connect(self._republish_status)

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
        msg = Metrics(device_id=self.device_id, values=values, run_id=self._status.run_id)
        try:
            self.send(self.topics.device(Family.METRICS, self.device_id), msg, qos=0)
        except ProtocolError as exc:  # e.g. a NaN loss: say so, keep publishing
            log.warning("%s: metrics not sent: %s", self.device_id, exc)

    def set_metrics_interval(self, interval: float) -> None:
        if self._scheduler is not None and interval > 0 and self._scheduler.get_job("metrics") is not None:
            self._scheduler.reschedule_job("metrics", trigger="interval", seconds=interval)

    def set_heartbeat_interval(self, interval: float) -> None:
        self.heartbeat_interval = interval
        if self._scheduler is not None:
            self._scheduler.reschedule_job("heartbeat", trigger="interval", seconds=interval)

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

    def healthy(self) -> bool:
        """For systemd's watchdog: the MQTT loop is connected and the scheduler runs."""
        scheduler_ok = self._scheduler is not None and self._scheduler.running
        loop_ok = getattr(self.transport, "loop_alive", lambda: True)()
        return bool(self.transport.connected and scheduler_ok and loop_ok)

    def stop_heartbeats(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None


class Clock:
    """Start of a compute step: wall time and this thread's CPU time."""

    __slots__ = ("cpu", "wall")

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.thread_time()


MAX_BANDWIDTH = 10e9  # bytes/s; a measurement above this is noise (the transfer time vanished in jitter)


_PROBE_SIZES = (64 * 1024, 256 * 1024, 1024 * 1024)  # bytes of the big probe, smallest first


class LinkProbes:
    """Measures the real path to a peer (device -> broker -> peer) and echoes the peers' probes.

    Echoes are sent from the network thread, so a busy training loop does not distort a peer's
    measurement. Bandwidth = (big - small bytes) / (rtt(big) - rtt(small)); latency = rtt(small) / 2.
    """

    def __init__(self, role: Role) -> None:
        self.role = role
        self._waiters: dict[int, threading.Event] = {}
        self._nonce = 0
        self._lock = threading.Lock()
        self._topics: set[str] = set()

    def watch(self, peer: str) -> None:
        """Listen to ``peer``'s probe topic: its probes to us and its echoes of ours."""
        topic = self.role.topics.device(Family.PROBE, peer)
        if topic not in self._topics:
            self._topics.add(topic)
            self.role.transport.subscribe(topic, self._on_probe)

    def unwatch_all(self) -> None:
        for topic in self._topics:
            self.role.transport.unsubscribe(topic)
        self._topics.clear()

    def _on_probe(self, topic: str, payload: bytes) -> None:
        # The role's limits apply here too (size, rate, sender), except the inbox: probes are not queued.
        accepted = self.role._accept(topic, payload, queued=False)
        if accepted is None:
            return
        msg = accepted[2]
        if not isinstance(msg, Probe) or msg.target != self.role.device_id:
            return
        if msg.reply:
            with self._lock:
                event = self._waiters.get(msg.nonce)
            if event is not None:
                event.set()
            return
        echo = Probe(source=self.role.device_id, target=msg.source, nonce=msg.nonce, reply=True)
        self.role.send(self.role.topics.device(Family.PROBE, self.role.device_id), echo)

    def _round_trip(self, target: str, size: int, timeout: float) -> float:
        with self._lock:
            self._nonce += 1
            nonce = self._nonce
            event = self._waiters[nonce] = threading.Event()
        probe = Probe(source=self.role.device_id, target=target, nonce=nonce, padding=bytes(size))
        started = time.perf_counter()
        self.role.send(self.role.topics.device(Family.PROBE, self.role.device_id), probe)
        ok = event.wait(timeout)
        elapsed = time.perf_counter() - started
        with self._lock:
            del self._waiters[nonce]
        if not ok:
            raise TrainingError(f"no probe echo from {target} within {timeout:.0f} s")
        return elapsed

    def measure(
        self, target: str, *, rounds: int = 5, small: int = 64, timeout: float = 30.0
    ) -> tuple[float, float]:
        """Return ``(bandwidth bytes/s, latency s)`` of the path to ``target``.

        The fastest of ``rounds`` round trips of each size is used: queueing behind other traffic only
        ever adds time. The big probe is the smallest of 64 KiB, 256 KiB and 1 MiB whose transfer takes
        at least 0.15 s at the rate a 64 KiB trial suggests (1 MiB at most): well above loopback jitter
        and the stalls of a CPU quota (a quarter-core cgroup stops a process for 75 ms of every 100 ms),
        without minutes of probing on a slow link.
        """
        self.watch(target)
        self._warm_up(target, small, timeout)
        trial = self._round_trip(target, _PROBE_SIZES[0], timeout) - self._round_trip(target, small, timeout)
        rate = _PROBE_SIZES[0] / max(trial, 1e-6)
        big = next((size for size in _PROBE_SIZES if size / rate >= 0.15), _PROBE_SIZES[-1])
        # All the rounds where they are quick (a fast link); three where each takes 0.15 s or more.
        quick = big / rate < 0.15
        smalls, bigs = [], []
        for _ in range(rounds if quick else min(rounds, 3)):
            smalls.append(self._round_trip(target, small, timeout))
            bigs.append(self._round_trip(target, big, timeout))
        rtt_small, rtt_big = min(smalls), min(bigs)
        bandwidth = (big - small) / max(rtt_big - rtt_small, (big - small) / MAX_BANDWIDTH)
        return bandwidth, rtt_small / 2

    def _warm_up(self, target: str, size: int, timeout: float) -> None:
        """The first round trip, retried: the echo of a probe sent before our subscription to the peer's
        probe topic (or the peer's to ours) was active at the broker is lost, not late."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                self._round_trip(target, size, min(2.0, max(0.1, left)))
                return
            except TrainingError:
                if time.monotonic() >= deadline:
                    raise TrainingError(f"no probe echo from {target} within {timeout:.0f} s") from None


def emulate_slowdown(started: Clock, factor: float, account: TimeAccount | None = None) -> float:
    """Make a compute step take ``factor`` times the CPU time it really used; return its emulated duration.

    CPU time, not wall time, is scaled: several emulated devices share this machine's cores, and
    waiting for a core is not part of a device's compute time. (Torch runs with one thread per role,
    so the calling thread's CPU time is the step's compute.)
    """
    cpu = time.thread_time() - started.cpu
    target = cpu * factor
    wall = time.perf_counter() - started.wall
    if factor > 1.0 and target > wall:
        time.sleep(target - wall)
    duration = max(target, wall) if factor > 1.0 else wall
    if account is not None:
        account.compute += duration
    return duration


def configure_threads(threads: int) -> None:
    torch.set_num_threads(threads)
