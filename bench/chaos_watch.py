"""What the chaos benchmark waits for (``bench/chaos.py``): never a fixed sleep, always something the cluster
says or did.

* :class:`Observer`: an MQTT client with the bench's observer login (it may read the cluster's topics and
  publish nothing) that keeps, with their arrival time, every message on ``run/events`` (faults,
  recoveries, ``run-resumed``, ``run-suspended``, joins, epochs, checkpoints), ``device/+/status`` and
  ``device/+/announce``, and the central node's metrics (the current worker list). It reconnects by itself
  after a broker restart (messages meanwhile are lost, as for every client).
* :class:`Progress`: the commits of the run, read from the audit log (``edgeagent/pipeline/audit.py``) as the
  processes append to it: stage 0, on the central node, applies a batch's update last, so its ``apply``
  lines are the batches the run committed, with their times (one machine, one clock). A reader thread
  takes the new lines of every file in the directory as they are written.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from bench.chaos_lab import OBSERVER, Site
from edgeagent.errors import ProtocolError
from edgeagent.pipeline.audit import Event as AuditEvent
from edgeagent.pipeline.audit import parse_line
from edgeagent.protocol.messages import Announce, Event, Message, Metrics, Status
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode
from edgeagent.transport.mqtt import BrokerUrl, MqttTransport, TlsOptions


@dataclass(frozen=True)
class Seen:
    t: float  # time.monotonic() at arrival
    sender: str
    message: Message


class Observer:
    """The cluster's events, statuses, announcements and the central node's metrics, as they arrive."""

    def __init__(self, url: str, cluster: str, site: Site) -> None:
        self.topics = Topics(cluster)
        self.seen: list[Seen] = []
        self.changed = threading.Condition()
        self.workers: list[str] = []  # the run's current worker list (the central node's metrics)
        ca, cert, key = site.files(OBSERVER)
        login = replace(BrokerUrl.parse(url), username=OBSERVER, password=site.observer_password)
        self.transport = MqttTransport(
            login, f"{OBSERVER}-{uuid.uuid4().hex[:6]}", tls=TlsOptions(ca, cert, key), max_backoff=1.0
        )
        for pattern in (
            self.topics.fixed(Family.EVENTS),
            self.topics.devices(Family.STATUS),
            self.topics.devices(Family.ANNOUNCE),
            self.topics.device(Family.METRICS, "central"),
        ):
            self.transport.subscribe(pattern, self._on)
        if not self.transport.wait_connected(30):
            raise RuntimeError(f"the observer could not connect to {url}")

    def _on(self, topic: str, payload: bytes) -> None:
        try:
            sender, msg = decode(payload)
        except ProtocolError:
            return
        now = time.monotonic()
        with self.changed:
            if isinstance(msg, Metrics):
                workers = msg.values.get("workers")
                if isinstance(workers, list):
                    self.workers = [str(w) for w in workers]
                return  # one a second: not kept
            self.seen.append(Seen(now, sender, msg))
            self.changed.notify_all()

    def events(
        self, name: str | None = None, *, since: float = 0.0, until: float = float("inf")
    ) -> list[Event]:
        with self.changed:
            return [
                s.message
                for s in self.seen
                if isinstance(s.message, Event) and since <= s.t <= until and name in (None, s.message.name)
            ]

    def timed_events(self, *, since: float, until: float = float("inf")) -> list[tuple[float, Event]]:
        with self.changed:
            return [
                (s.t, s.message) for s in self.seen if isinstance(s.message, Event) and since <= s.t <= until
            ]

    def wait(
        self, what: str, match: Callable[[Seen], bool], *, timeout: float, since: float = 0.0
    ) -> Seen | None:
        """The first message since ``since`` that ``match``es; None after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for s in self.seen:
                    if s.t >= since and match(s):
                        return s
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(min(left, 1.0))

    def close(self) -> None:
        self.transport.close()


def is_status(device: str, state: str) -> Callable[[Seen], bool]:
    return lambda s: isinstance(s.message, Status) and s.sender == device and s.message.state == state


def is_announce(device: str) -> Callable[[Seen], bool]:
    return lambda s: isinstance(s.message, Announce) and s.sender == device


@dataclass(frozen=True)
class Commit:
    t: float
    batch: int
    pid: int


class Progress:
    """The batches the run committed (stage 0's applies in the audit log), as they are written."""

    def __init__(self, directory: Path, poll: float = 0.1) -> None:
        self.directory = directory
        self.commits: list[Commit] = []
        self.events: list[AuditEvent] = []
        self.changed = threading.Condition()
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, str] = {}
        self._stage0: set[tuple[int, int]] = set()  # (pid, copy) of every stage 0 built
        self._stop = threading.Event()
        self._poll = poll
        self._thread = threading.Thread(target=self._run, name="audit-tail", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # The files are appended to by other processes: reading what is new every poll interval is how a
        # file is followed without inotify (tail -f does the same).
        while not self._stop.wait(self._poll):
            self.read_new()

    def read_new(self) -> None:
        new: list[AuditEvent] = []
        for path in sorted(self.directory.glob("*.jsonl")):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read()
            if not data:
                continue
            self._offsets[path] = offset + len(data)
            text = self._partial.pop(path, "") + data.decode("utf-8", errors="replace")
            lines = text.split("\n")
            if lines[-1]:
                self._partial[path] = lines[-1]  # a line still being written
            for line in lines[:-1]:
                event = parse_line(line)
                if event is not None:
                    new.append(event)
        if not new:
            return
        new.sort(key=lambda e: e.t)
        with self.changed:
            for e in new:
                self.events.append(e)
                if e.kind == "build" and e.stage == 0:
                    self._stage0.add((e.pid, e.copy))
                elif e.kind == "apply" and (e.pid, e.copy) in self._stage0:
                    self.commits.append(Commit(e.t, e.batch, e.pid))
            self.changed.notify_all()

    def highest(self) -> int:
        """The highest batch committed so far (-1: none); a rollback does not lower it."""
        with self.changed:
            return max((c.batch for c in self.commits), default=-1)

    def wait_for(
        self,
        match: Callable[[Commit], bool],
        *,
        timeout: float,
        since: float = 0.0,
        give_up: Callable[[], bool] = lambda: False,
    ) -> Commit | None:
        """The first commit at or after ``since`` that ``match``es; None after ``timeout`` s, or as soon as
        ``give_up()`` (checked at least every second: the run ended, say)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for c in self.commits:
                    if c.t >= since and match(c):
                        return c
                left = deadline - time.monotonic()
                if left <= 0 or give_up():
                    return None
                self.changed.wait(min(left, 1.0))

    def pace(self, *, last: int = 30, before: float = float("inf")) -> float:
        """Seconds per committed batch: the median gap between consecutive batches among the last ``last``
        commits before ``before`` (a replay or a pause does not count: only batch b followed by b + 1)."""
        with self.changed:
            recent = [c for c in self.commits if c.t < before][-last:]
        gaps = [b.t - a.t for a, b in itertools.pairwise(recent) if b.batch == a.batch + 1]
        return statistics.median(gaps) if gaps else float("nan")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.read_new()


__all__ = ["Commit", "Observer", "Progress", "Seen", "is_announce", "is_status"]
