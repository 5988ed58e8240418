"""What the central node and the workers share: the inbox, typed messages out, status and heartbeats."""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass, field

import torch
from apscheduler.schedulers.background import BackgroundScheduler

from edgeagent.errors import ProtocolError
from edgeagent.protocol.messages import Heartbeat, Message, Status, decode, encode
from edgeagent.protocol.topics import Family, TopicInfo, Topics
from edgeagent.transport.base import Transport

log = logging.getLogger(__name__)


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
    """A decoded message with where it came from."""

    topic: TopicInfo
    sender: str
    message: Message


class Role:
    """Decodes everything it subscribes to on the network thread and queues it for the role's own thread.

    Malformed payloads and unknown topics are logged and dropped here, so the training loop only
    ever sees well-typed messages.
    """

    def __init__(self, transport: Transport, topics: Topics, device_id: str) -> None:
        self.transport = transport
        self.topics = topics
        self.device_id = device_id
        self.inbox: queue.Queue[Inbound] = queue.Queue()
        self.dropped = 0
        self._heartbeat_seq = 0
        self._scheduler: BackgroundScheduler | None = None
        self.heartbeat_interval = 1.0
        self._status = Status(device_id=device_id, state="online")
        self.times = TimeAccount()

    # -- receiving -----------------------------------------------------------------------------

    def listen(self, pattern: str) -> None:
        self.transport.subscribe(pattern, self._on_payload)

    def stop_listening(self, pattern: str) -> None:
        self.transport.unsubscribe(pattern)

    def _on_payload(self, topic: str, payload: bytes) -> None:
        try:
            info = self.topics.parse(topic)
            sender, message = decode(payload)
        except ProtocolError as exc:
            self.dropped += 1
            log.warning("%s dropped a %d-byte message on %s: %s", self.device_id, len(payload), topic, exc)
            return
        self.inbox.put(Inbound(info, sender, message))

    def next_message(self, timeout: float | None) -> Inbound | None:
        if timeout == 0:
            try:
                return self.inbox.get_nowait()
            except queue.Empty:
                return None
        started = time.perf_counter()
        try:
            return self.inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        finally:
            self.times.idle += time.perf_counter() - started

    # -- sending -------------------------------------------------------------------------------

    def send(self, topic: str, message: Message, *, retain: bool = False, qos: int = 1) -> None:
        started = time.perf_counter()
        self.transport.publish(topic, encode(message, sender=self.device_id), qos=qos, retain=retain)
        self.times.communication += time.perf_counter() - started

    def set_status(self, state: str, *, run_id: str = "", stage: int = -1, detail: str = "") -> None:
        self._status = Status(
            device_id=self.device_id, state=state, run_id=run_id, stage=stage, detail=detail
        )
        self.send(self.topics.device(Family.STATUS, self.device_id), self._status, retain=True)

    def _republish_status(self) -> None:
        self.send(self.topics.device(Family.STATUS, self.device_id), self._status, retain=True)

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
