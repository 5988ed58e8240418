"""The role runtime every role and every training mode shares: the inbox and its limits, typed messages
out, handlers per message type and one waiting primitive; status, heartbeats and metrics (the role's
:class:`~edgeagent.runtime.pulse.Pulse`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from edgeagent.errors import TrainingError
from edgeagent.protocol.identity import StageSenders
from edgeagent.protocol.limits import InboxLimits
from edgeagent.protocol.messages import Message, Status, StatusState
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import encode
from edgeagent.runtime import hoptrace
from edgeagent.runtime.compute import TimeAccount
from edgeagent.runtime.intake import Inbound, Intake
from edgeagent.runtime.pulse import Pulse
from edgeagent.transport.base import Transport

if TYPE_CHECKING:
    from edgeagent.transport.access import Access

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
F = TypeVar("F")

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
        self.clock: Callable[[], float] = time.monotonic  # the gate's clock (tests set their own)
        self.dropped = 0
        self.times = TimeAccount()
        # The network thread's half: checks every payload and queues what passes (runtime/intake.py).
        self.intake = Intake(self, limits)
        self.inbox = self.intake.inbox
        self.gate = self.intake.gate
        # Status, heartbeats, metrics and the scheduler's thread (runtime/pulse.py).
        self.pulse = Pulse(self)
        self._handlers: dict[type[Message], Handler] = {}
        # Whose stage outputs are taken: the run in progress sets ``senders.plan`` (protocol/identity.py).
        self.senders = StageSenders()

    # -- receiving -----------------------------------------------------------------------------

    def listen(self, pattern: str) -> None:
        self.transport.subscribe(pattern, self.intake.on_payload)

    def stop_listening(self, pattern: str) -> None:
        self.transport.unsubscribe(pattern)

    def discard(self, item: Inbound, reason: str) -> None:
        """Drop a well-formed message that does not fit the run (:meth:`Intake.discard`)."""
        self.intake.discard(item, reason)

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
        """The next queued message, waiting up to ``timeout`` s (:meth:`Intake.next_message`)."""
        return self.intake.next_message(timeout)

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
            self.intake.refuse(item, problem)
            return
        hoptrace.mark("taken", item.wire_topic, item.message)
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
        hoptrace.mark("encode", topic, message)
        payload = encode(message, sender=self.device_id)
        hoptrace.mark("publish", topic, message)
        self.transport.publish(topic, payload, qos=qos, retain=retain)
        hoptrace.mark("sent", topic, message)
        self.times.sent(len(payload), time.perf_counter() - started)
        return len(payload)

    def set_status(self, state: StatusState, *, run_id: str = "", stage: int = -1, detail: str = "") -> None:
        """Publish this device's retained status (:meth:`Pulse.set_status`)."""
        self.pulse.set_status(state, run_id=run_id, stage=stage, detail=detail)

    def set_metrics_interval(self, interval: float) -> None:
        self.pulse.set_metrics_interval(interval)

    def run_soon(self, func: Callable[..., object], *args: object) -> None:
        """Run ``func(*args)`` on the scheduler's thread (:meth:`Pulse.run_soon`)."""
        self.pulse.run_soon(func, *args)

    def background(self, func: Callable[[], object], job_id: str) -> bool:
        """Run ``func`` on the scheduler's thread as job ``job_id`` (:meth:`Pulse.background`)."""
        return self.pulse.background(func, job_id)


def mqtt_transport(topics: Topics, device_id: str, access: Access, *, link_mbps: float = 0.0) -> Transport:
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
        will=offline_will_for(topics, device_id),
        link_mbps=link_mbps,
        tls=tls,
        insecure_plaintext=access.insecure_plaintext,
    )


def offline_will_for(topics: Topics, device_id: str) -> tuple[str, bytes]:
    """The last will: a retained ``offline`` status."""
    status = Status(device_id=device_id, state="offline")
    return topics.device(Family.STATUS, device_id), encode(status, sender=device_id)
