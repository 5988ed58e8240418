"""A role's intake: what the network thread does with every payload before the role's own thread sees it.

Parsing the topic, the limits (size, rate, room in the inbox: :mod:`edgeagent.protocol.limits`), decoding,
the sender's identity (:func:`~edgeagent.protocol.identity.identity_problem`) and finite tensors are checked
here, in that order (cheapest first: a flood is refused before it is decoded); what passes is queued for the
role's thread, what does not is logged (rate limited) and counted on the role (``dropped``).
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from edgeagent.errors import ProtocolError
from edgeagent.protocol.identity import identity_problem
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
from edgeagent.protocol.messages import Message
from edgeagent.protocol.topics import TopicInfo, Topics
from edgeagent.protocol.wire import decode
from edgeagent.runtime import hoptrace
from edgeagent.runtime.compute import TimeAccount

log = logging.getLogger("edgeagent.runtime.role")


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


class IntakeOwner(Protocol):
    """What the intake needs of its role: names, the clock of the limits (tests set their own), the time
    account it charges waiting to, the drop counter, and the role's hooks on the network thread."""

    topics: Topics
    device_id: str
    times: TimeAccount
    dropped: int
    clock: Callable[[], float]

    def on_arrival(self, sender: str, message: Message) -> None: ...

    def on_nonfinite(self, sender: str, message: Message, problem: str) -> None: ...


class Intake:
    """The network thread's half of a role (see the module doc) and the queue between the two threads."""

    def __init__(self, owner: IntakeOwner, limits: InboxLimits | None) -> None:
        self.owner = owner
        self.inbox: queue.Queue[Inbound] = queue.Queue()  # bounded by the gate, not by the queue
        self.gate = InboxGate(limits, name=owner.device_id)

    def on_payload(self, topic: str, payload: bytes) -> None:
        """The subscriptions' callback (network thread): check, then queue for the role's thread."""
        arrived = hoptrace.now()
        accepted = self.accept(topic, payload, queued=True)
        if accepted is None:
            return
        info, sender, message = accepted
        hoptrace.mark("arrive", topic, message, arrived)
        hoptrace.mark("decoded", topic, message)
        self.owner.on_arrival(sender, message)
        verdict = self.gate.enqueue(topic, len(payload), self.owner.clock())
        if not verdict.accepted:
            self._dropped(verdict)
            return
        self.inbox.put(Inbound(info, sender, message, wire_topic=topic, size=len(payload)))

    def accept(self, topic: str, payload: bytes, *, queued: bool) -> tuple[TopicInfo, str, Message] | None:
        """Parse, limit (before decoding: cheap), decode and check the sender of a payload; None: dropped."""
        owner = self.owner
        now = owner.clock()
        try:
            info = owner.topics.parse(topic)
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
            owner.on_nonfinite(sender, message, problem)
            return None
        return info, sender, message

    def discard(self, item: Inbound, reason: str) -> None:
        """Drop a well-formed message that does not fit the run: counted in ``dropped`` and logged as the
        limits allow (a flood of them must not flood the log either)."""
        topic = item.wire_topic or item.topic.family.value
        detail = f"dropped {_a(item.message.KIND.value)} message from {item.sender!r} on {topic}: {reason}"
        self._dropped(self.gate.reject(topic, INVALID, detail, self.owner.clock()))

    def refuse(self, item: Inbound, reason: str) -> None:
        """Drop a message whose sender may not have sent it (it does not hold the stage, say): counted as a
        ``sender`` drop and logged as the limits allow."""
        topic = item.wire_topic or item.topic.family.value
        detail = f"dropped {_a(item.message.KIND.value)} message from {item.sender!r} on {topic}: {reason}"
        self._dropped(self.gate.reject(topic, SENDER, detail, self.owner.clock()))

    def report_drops(self) -> None:
        """Log, once, how many messages were dropped so far and why (the lines about single drops are
        rate limited: this total is the one complete account), if any were."""
        drops = self.gate.drops
        owner = self.owner
        if owner.dropped:
            reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(drops.items()))
            log.warning("%s: %d messages dropped so far (%s)", owner.device_id, owner.dropped, reasons)

    def _dropped(self, verdict: Verdict) -> None:
        if verdict.log is not None:  # logged first: whoever sees the count also finds the line
            log.warning("%s", verdict.log)
        self.owner.dropped += 1

    def next_message(self, timeout: float | None) -> Inbound | None:
        """The next queued message (waiting up to ``timeout`` s; 0: none if none is queued); the time spent
        waiting is the role's idle time."""
        for line in self.gate.flush(self.owner.clock()):  # summaries of drops no line has reported yet
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
                self.owner.times.idle += time.perf_counter() - started
        self.owner.times.received_bytes += item.size
        self.gate.release(item.wire_topic, item.size)
        return item


__all__ = ["Inbound", "Intake", "IntakeOwner"]
