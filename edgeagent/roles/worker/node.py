"""The worker node: the device's side of every run, whatever the training mode.

A :class:`Worker` owns the process's lifecycle (``serve``, ``stop``, ``--once``), the birth message
(``announce``), the device profile applied live, the budget of error reports, fault injection and the
loop. The run itself belongs to a training mode: an ``Assign`` names the mode, found by the
:data:`~edgeagent.roles.mode.ModeLookup` the node is handed (the CLI passes :func:`edgeagent.modes.mode`),
whose :class:`~edgeagent.roles.mode.WorkerSession` installs its data plane's handlers over the node's
own for the run's lifetime; the node gives the session its turn whenever the inbox is empty. The
device's ``h`` (papers/004 Sec. 3.2) is measured when a ``Discover`` names the model and on a
``characterise`` command, and travels with the announcement (:mod:`.characterise`).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from typing import Any, Literal

import torch

from edgeagent import __version__
from edgeagent.config import WorkerConfig
from edgeagent.errors import ConfigError, EdgeAgentError
from edgeagent.injected import parse_send_nan
from edgeagent.ops.profiles import DeviceProfile
from edgeagent.ops.systemd import Notifier, Watchdog, watchdog_interval
from edgeagent.predictor.measure import Characterisation
from edgeagent.protocol.commands import Characterise, Emulate
from edgeagent.protocol.identity import HasPlan
from edgeagent.protocol.limits import InboxLimits
from edgeagent.protocol.messages import (
    Announce,
    Assign,
    Discover,
    ErrorCode,
    ErrorReport,
    LinkReport,
    Message,
    Profile,
    Status,
)
from edgeagent.protocol.topics import Family, Topics
from edgeagent.roles.mode import ModeLookup, WorkerSession
from edgeagent.roles.worker.central_watch import CentralTracker, Verdict
from edgeagent.roles.worker.characterise import Characteriser, announced
from edgeagent.roles.worker.device import DeviceCommands
from edgeagent.runtime.compute import configure_threads
from edgeagent.runtime.probes import LinkProbes
from edgeagent.runtime.role import Handler, Inbound, Role, mqtt_transport
from edgeagent.transport.base import Transport

log = logging.getLogger(__name__)

_ERROR_REPORTS_PER_10S = 10


class Worker(Role):
    """A device that takes whichever part of a run the central node assigns it (see the module doc);
    ``modes`` finds the training mode an ``Assign`` names (:func:`edgeagent.modes.mode`)."""

    def __init__(
        self,
        config: WorkerConfig,
        transport: Transport | None = None,
        *,
        modes: ModeLookup,
        limits: InboxLimits | None = None,
    ) -> None:
        topics = Topics(config.cluster)
        self.config = config
        self.modes = modes
        self.slowdown = config.slowdown
        self._owns_transport = transport is None
        if transport is None:
            transport = mqtt_transport(topics, config.device_id, config, link_mbps=config.link_mbps)
        super().__init__(transport, topics, config.device_id, limits=limits)
        self.session: WorkerSession | None = None  # the run this device is in
        self.left_run = ""  # the run that went on without this device (it may be asked back), if any
        # The run's central node, followed from its Assign: its statuses and its absence (central_watch).
        self.tracker = CentralTracker(self, config.central_offline_floor)
        self._installed: list[type[Message]] = []  # the message types the session handles
        self.completed_runs = 0
        self.probes = LinkProbes(self)
        self.memory_limit_mb = config.memory_limit_mb
        self.link_mbps = config.link_mbps
        self.profile: DeviceProfile | None = None  # the last good one
        self._stopping = False
        self._error_window: tuple[float, int] = (0.0, 0)  # (start, reports) of the error-report budget
        self._error_lock = threading.Lock()
        self._eval_batches = 0  # evaluation batches taken in this process's life (fault injection)
        self._nan = parse_send_nan(config.send_nan) if config.send_nan else None
        self._nan_sent = 0  # messages filled with NaN so far (fault injection)
        self._nan_armed = False  # --nan-on-usr1: a SIGUSR1 came; the next such message carries NaN
        self.characteriser = Characteriser(
            config.device_id, config.characterise_budget, rounds=config.characterise_rounds
        )
        self.commands = DeviceCommands(self)  # h, emulate, profiles (device.py)
        # The node's own handlers; a session's replace them for its run's lifetime if it handles the type.
        self._own: dict[type[Message], Handler] = {
            Assign: self._on_assign,
            Discover: self.commands.on_discover,
            Profile: self.commands.on_profile,
            Emulate: self.commands.on_emulate,
            Characterise: self.commands.on_characterise,
        }
        for kind, handler in self._own.items():
            self.on(kind, handler)

    # -- lifecycle -----------------------------------------------------------------------------

    def serve(self) -> int:
        """Serve runs until stopped (or after one run with ``once``). Returns a process exit code."""
        configure_threads(self.config.threads)
        self.listen(self.topics.fixed(Family.DISCOVER))
        self.listen(self.topics.fixed(Family.COMMAND))
        self.listen(self.topics.fixed(Family.COMMIT))
        self.listen(self.topics.device(Family.CONTROL, self.device_id))
        self.listen(self.topics.devices(Family.REQUEST))
        self.listen(self.topics.device(Family.PROFILE, self.device_id))  # retained: arrives on connect
        self.transport.on_connect(self.tracker.reconnected)
        if not self.transport.wait_connected(30):
            log.warning("%s: broker not reachable yet; still trying", self.device_id)
        self.set_status("idle")
        self.pulse.start(self.config.heartbeat_interval)
        self.pulse.start_metrics(self.config.metrics_interval, self._metrics)
        self.announce()
        notifier = Notifier()
        notifier.ready(f"{self.device_id} idle on {self.topics.base}")
        interval = watchdog_interval()
        watchdog = Watchdog(notifier, self.pulse.healthy, interval).start() if interval else None
        try:
            while not self._stopping:
                self._step()
        finally:
            if watchdog is not None:
                watchdog.stop()
            notifier.send("STOPPING=1")
            self.pulse.stop()
            # A clean exit: monitors show the device as gone on purpose (the last will says "offline"
            # only after a crash).
            self.set_status("left")
            if self._owns_transport:
                self.transport.close()
        return 0

    def stop(self) -> None:
        self._stopping = True

    def announce(self, h: Characterisation | Literal["latest"] | None = "latest") -> None:
        """Say this device is available, with ``h`` (``latest``: of the model measured last, if measured
        at the current slowdown; None: without)."""
        busy = self.session.run_id if self.session else ""
        if h == "latest":
            h = self.characteriser.latest(self.slowdown)
        self.send(
            self.topics.device(Family.ANNOUNCE, self.device_id),
            Announce(
                device_id=self.device_id,
                busy_with=busy,
                threads=self.config.threads,
                slowdown=self.slowdown,
                software=__version__,
                memory_limit=self.memory_limit_mb * 1e6,
                paces=getattr(self.transport, "throttle", None) is not None,
                profile_hash=self.profile.digest() if self.profile else "",
                **announced(h),
            ),
        )

    # -- the loop ------------------------------------------------------------------------------

    def _step(self) -> None:
        """One turn of the loop: handle what is queued (without waiting if the run has work), then let
        the run do one unit of work."""
        session = self.session
        # A session with deadlines (the allreduce mode's timeouts) says how long the loop may wait.
        hint = getattr(session, "wait_hint", None)
        self.pump(0 if session is not None and session.has_work() else hint() if hint else 0.5)
        # Leave a run whose central node has been offline longer than its window (central_watch).
        if self.session is not None and self.tracker.gone(self.session.run_id):
            self.end_run(rejoin=True)
        session = self.session  # the messages may have started, replaced or ended the run
        if session is None:
            return
        try:
            session.step()
        except EdgeAgentError as exc:
            log.error("%s: %s; the batch is dropped", self.device_id, exc)
            self.report_error("compute", str(exc))

    def dispatch(self, item: Inbound) -> None:
        """Hand ``item`` to its handler; a message the handler finds wrong is dropped and reported, it
        never stops the worker."""
        try:
            super().dispatch(item)
        except EdgeAgentError as exc:
            log.error("%s: %s (from %s); message dropped", self.device_id, exc, item.sender)
            self.report_error("message", str(exc))

    # -- runs ----------------------------------------------------------------------------------

    def _on_assign(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, Assign)
        if self.session is not None and self.session.run_id != msg.run_id:
            self.report_error("busy", f"already training run {self.session.run_id}", msg.run_id)
            return
        refusal = self.config.model_refusal(msg.model.get("name"))
        if refusal is not None:
            log.error("%s: %s", self.device_id, refusal)
            self.report_error("assign", refusal, msg.run_id)
            return
        try:
            training = self.modes(msg.mode)
        except ConfigError as exc:
            self.report_error("assign", str(exc), msg.run_id)
            return
        session = training.worker_session(self, msg)  # leaves the current run once it can take this one
        if session is None:
            return
        self.session = session
        # Stage outputs are taken only from the devices the session's plan says hold the stage.
        self.senders.plan = session.plan_view if isinstance(session, HasPlan) else None
        handlers = session.handlers()
        self._installed = list(handlers)
        for kind, handler in handlers.items():
            self.on(kind, handler)
        # Whoever sent the Assign runs the run: watch for its absence (central_watch). Its status topic
        # is this node's as well as the session's: every mode's session then hears its last will.
        self.tracker.follow(item.sender, msg.heartbeat_interval or self.pulse.heartbeat_interval)

    def leave_run(self) -> None:
        """Leave the run at once: the session unsubscribes, the node's own handlers come back, and the
        device says it is idle."""
        session = self.session
        if session is None:
            return
        session.close()
        self.tracker.unfollow()
        for kind in self._installed:
            own = self._own.get(kind)
            if own is None:
                self.off(kind)
            else:
                self.on(kind, own)
        self._installed = []
        self.session = None
        self.senders.plan = None
        self.completed_runs += 1
        self.set_status("idle")

    def end_run(self, *, rejoin: bool = False) -> None:
        """The run is over (its ``stop``, or the central node gone idle) or went on without this device
        (``rejoin``: announce as idle, so that it can join again at the next re-split): final figures,
        then leave; with ``--once`` the process then exits."""
        self.pulse.publish_metrics()  # the final figures of this run
        self.intake.report_drops()
        self.left_run = self.session.run_id if rejoin and self.session is not None else ""
        self.leave_run()
        if rejoin:
            self.announce()
        elif self.config.once:
            self._stopping = True

    def central_status(self, msg: Status, central: str, run_id: str) -> Verdict | None:
        """What a session's central node's status means for its run (central_watch), logged: an idle
        central node ends the run (``over``); one that left it (suspended) or trains another run makes
        this device leave it and announce itself idle (``leave``). The session acts on it."""
        return self.tracker.status(msg, central, run_id)

    # -- the central node's absence (central_watch) -------------------------------------------

    def on_arrival(self, sender: str, message: Message) -> None:
        # Network thread: a sign of life of the run's central node clears its absence at once, however
        # long the loop is busy with a batch.
        self.tracker.arrived(sender, message)

    def _metrics(self) -> dict[str, Any] | None:
        """What this device publishes on its metrics topic (docs/protocol.md): its run's figures."""
        session = self.session
        return None if session is None else session.metrics()

    # -- commands about the device -------------------------------------------------------------

    def measure_link(self, run_id: str, target: str) -> None:
        """Measure the link to ``target`` on a thread of its own (the loop goes on) and report it."""
        threading.Thread(target=self._probe, args=(run_id, target), daemon=True).start()

    def _probe(self, run_id: str, target: str) -> None:
        try:
            bandwidth, latency = self.probes.measure(target)
        except EdgeAgentError as exc:
            self.report_error("probe", str(exc), run_id)
            return
        log.info("%s -> %s: %.1f MB/s, %.2f ms", self.device_id, target, bandwidth / 1e6, latency * 1e3)
        self.send(
            self.topics.device(Family.REPLY, self.device_id),
            LinkReport(
                run_id=run_id, source=self.device_id, target=target, bandwidth=bandwidth, latency=latency
            ),
        )

    def on_nonfinite(self, sender: str, message: Message, problem: str) -> None:
        """A message of this device's run held values that are not finite (dropped on the network
        thread): tell the central node who sent it; a device that keeps doing so ends the run there."""
        session = self.session
        run_id = getattr(message, "run_id", None)
        if session is not None and run_id == session.run_id:
            what = f"dropped {message.KIND.value} from {sender}: {problem}"
            self.report_error("nonfinite", what, run_id, about=sender)

    def report_error(self, code: ErrorCode, reason: str, run_id: str = "", *, about: str = "") -> None:
        """Tell the central node, at most a few times per 10 s: bad input must not turn into a flood."""
        now = time.monotonic()
        with self._error_lock:  # also called on the network thread (on_nonfinite)
            if now - self._error_window[0] > 10.0:
                self._error_window = (now, 0)
            full = self._error_window[1] >= _ERROR_REPORTS_PER_10S
            if not full:
                self._error_window = (self._error_window[0], self._error_window[1] + 1)
        if full:
            log.warning("%s: %s (not reported: too many error reports)", self.device_id, reason)
            return
        self.send(
            self.topics.device(Family.REPLY, self.device_id),
            ErrorReport(device_id=self.device_id, code=code, reason=reason, run_id=run_id, about=about),
        )

    # -- fault injection -----------------------------------------------------------------------

    def fault_at_backward(self, batch_id: int) -> None:
        """``--die-at-backward``: die at the backward pass of batch ``batch_id`` if that is the one."""
        if self.config.die_at_backward == batch_id:
            self._die(f"at the backward pass of batch {batch_id}")

    def fault_at_evaluation(self, batch_id: int) -> None:
        """``--die-at-eval``: count an evaluation batch (over the process's life, not per run) and die
        at the N-th."""
        self._eval_batches += 1
        if self.config.die_at_eval == self._eval_batches:
            self._die(f"at evaluation batch {self._eval_batches} (id {batch_id})")

    def arm_nan(self) -> None:
        """``--nan-on-usr1 KIND`` (its signal handler): the next KIND message this device sends is NaN."""
        self._nan_armed = True

    def poisoned(self, kind: str, batch: int, tensor: torch.Tensor) -> torch.Tensor:
        """``--send-nan KIND@BATCH[+]``: ``tensor`` filled with NaN if it goes out in the message it names
        (once per process life, or from that batch on with ``+``), else ``tensor`` itself. ``--nan-on-usr1
        KIND``: filled once after each SIGUSR1."""
        if self._nan_armed and kind == self.config.nan_on_usr1:
            self._nan_armed = False
            log.warning(
                "%s: fault injection (SIGUSR1): NaN in the %s of batch %d", self.device_id, kind, batch
            )
            return torch.full_like(tensor, math.nan)
        if self._nan is None:
            return tensor
        wanted, at, forever = self._nan
        if kind != wanted or batch < at or not (forever or (batch == at and not self._nan_sent)):
            return tensor
        self._nan_sent += 1
        if self._nan_sent <= 3:
            log.warning("%s: fault injection: NaN in the %s of batch %d", self.device_id, kind, batch)
        return torch.full_like(tensor, math.nan)

    def _die(self, where: str) -> None:
        """SIGKILL this process (fault injection). What it sent before is delivered first, so that a
        fault "at batch N" is one at batch N and not, by a race with the network thread, one before."""
        log.warning("%s: fault injection: SIGKILL %s", self.device_id, where)
        self.transport.flush(5.0)
        os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["Worker"]
