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
from edgeagent.config import WorkerConfig, parse_send_nan
from edgeagent.errors import ConfigError, EdgeAgentError
from edgeagent.ops.profiles import DeviceProfile, parse_profile
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
    StatusState,
)
from edgeagent.protocol.topics import Family, Topics
from edgeagent.roles.mode import ModeLookup, WorkerSession
from edgeagent.roles.worker.central_watch import CENTRAL_OFFLINE_BEATS, CentralWatch, Verdict, status_verdict
from edgeagent.roles.worker.characterise import Characteriser, announced
from edgeagent.runtime.compute import configure_threads
from edgeagent.runtime.probes import LinkProbes
from edgeagent.runtime.role import Handler, Inbound, Role
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
            transport = Role.mqtt_transport(topics, config.device_id, config, link_mbps=config.link_mbps)
        super().__init__(transport, topics, config.device_id, limits=limits)
        self.session: WorkerSession | None = None  # the run this device is in
        self.central: CentralWatch | None = None  # the absence of that run's central node
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
        # The node's own handlers; a session's replace them for its run's lifetime if it handles the type.
        self._own: dict[type[Message], Handler] = {
            Assign: self._on_assign,
            Discover: self._on_discover,
            Profile: self._on_profile,
            Emulate: self._on_emulate,
            Characterise: self._on_characterise,
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
        self.transport.on_connect(self._on_broker_connect)
        if not self.transport.wait_connected(30):
            log.warning("%s: broker not reachable yet; still trying", self.device_id)
        self.set_status("idle")
        self.start_heartbeats(self.config.heartbeat_interval)
        self.start_metrics(self.config.metrics_interval, self._metrics)
        self.announce()
        notifier = Notifier()
        notifier.ready(f"{self.device_id} idle on {self.topics.base}")
        interval = watchdog_interval()
        watchdog = Watchdog(notifier, self.healthy, interval).start() if interval else None
        try:
            while not self._stopping:
                self._step()
        finally:
            if watchdog is not None:
                watchdog.stop()
            notifier.send("STOPPING=1")
            self.stop_heartbeats()
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
        self._check_central()
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
        interval = msg.heartbeat_interval or self.heartbeat_interval
        self.central = CentralWatch(item.sender, interval, self.config.central_offline_floor)
        self.listen(self.topics.device(Family.STATUS, item.sender))

    def leave_run(self) -> None:
        """Leave the run at once: the session unsubscribes, the node's own handlers come back, and the
        device says it is idle."""
        session = self.session
        if session is None:
            return
        session.close()
        if self.central is not None:
            self.stop_listening(self.topics.device(Family.STATUS, self.central.central))
            self.central = None
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
        self.publish_metrics()  # the final figures of this run
        self.report_drops()
        self.leave_run()
        if rejoin:
            self.announce()
        elif self.config.once:
            self._stopping = True

    def central_status(self, msg: Status, central: str, run_id: str) -> Verdict | None:
        """What a session's central node's status means for its run (central_watch), logged: an idle
        central node ends the run (``over``); one that left it (suspended) or trains another run makes
        this device leave it and announce itself idle (``leave``). The session acts on it."""
        verdict = status_verdict(msg, central, run_id)
        if verdict is not None:
            log.warning("%s: %s; leaving the run", self.device_id, verdict.reason)
        return verdict

    # -- the central node's absence (central_watch) -------------------------------------------

    def on_arrival(self, sender: str, message: Message) -> None:
        # Network thread: a sign of life of the run's central node clears its absence at once, however
        # long the loop is busy with a batch.
        watch = self.central
        if watch is not None:
            watch.arrived(sender, message, time.monotonic())

    def _on_broker_connect(self) -> None:
        watch = self.central  # network thread, before the retained statuses of the subscriptions arrive
        if watch is not None:
            watch.reconnected(time.monotonic())

    def _check_central(self) -> None:
        """Leave a run whose central node has been offline longer than its window (central_watch)."""
        watch = self.central
        if watch is None or self.session is None or not self.transport.connected:
            return
        gone = watch.expired(time.monotonic())
        if gone is None:
            return
        log.warning(
            "%s: the central node %s of run %s has been offline for %.1f s (window %.1f s: %g of its "
            "%.2f s heartbeats, at least %.0f s); leaving the run and announcing this device idle",
            self.device_id,
            watch.central,
            self.session.run_id,
            gone,
            watch.window,
            CENTRAL_OFFLINE_BEATS,
            watch.interval,
            watch.floor,
        )
        self.end_run(rejoin=True)

    def _metrics(self) -> dict[str, Any] | None:
        """What this device publishes on its metrics topic (docs/protocol.md): its run's figures."""
        session = self.session
        return None if session is None else session.metrics()

    # -- commands about the device -------------------------------------------------------------

    def _on_emulate(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, Emulate)
        if self.session is None or msg.run_id != self.session.run_id:
            return  # commands belong to a run: another run's (or a forged one's) are not ours
        if msg.device == self.device_id:
            log.info("%s: slowdown %.1f -> %.1f", self.device_id, self.slowdown, msg.slowdown)
            self.slowdown = msg.slowdown

    def _on_discover(self, item: Inbound) -> None:
        """Announce; with the model named, with its ``h``, measured first unless known. A device busy
        with another run does not measure (it would slow that run down): it says what it knows."""
        msg = item.message
        assert isinstance(msg, Discover)
        if not msg.model:
            self.announce()
        elif self.session is not None and self.session.run_id != msg.run_id:
            self.announce(self.characteriser.lookup(msg.model, msg.batch_size, self.slowdown))
        else:
            try:
                self.announce(self._characterise(msg.model, msg.batch_size, fresh=False))
            except ConfigError:  # logged by the characteriser; the announcement goes without h
                self.announce(None)

    def _on_characterise(self, item: Inbound) -> None:
        """Measure ``h`` again (the cache bypassed) and announce it; the node's own command, so also
        during a run (which waits meanwhile)."""
        msg = item.message
        assert isinstance(msg, Characterise)
        if msg.device != self.device_id:
            return
        if self.session is not None and msg.run_id != self.session.run_id:
            reason = f"not measuring h for run {msg.run_id}: training run {self.session.run_id}"
            self.report_error("busy", reason, msg.run_id)
            return
        try:
            self.announce(self._characterise(msg.model, msg.batch_size, fresh=True))
        except ConfigError as exc:  # logged by the characteriser
            self.report_error("command", str(exc), msg.run_id)
            self.announce(None)

    def _characterise(self, model: dict[str, Any], batch_size: int, *, fresh: bool) -> Characterisation:
        """``h`` for ``model`` at the current slowdown, measured with this device's torch threads; a
        :class:`ConfigError` for a model this worker may not build (``allowed_models``)."""
        refusal = self.config.model_refusal(model.get("name"))
        if refusal is not None:
            log.error("%s: not measuring h: %s", self.device_id, refusal)
            raise ConfigError(refusal)
        threads = self.profile.threads if self.profile else self.config.threads
        return self.characteriser.measure(
            model, batch_size, slowdown=self.slowdown, threads=threads, fresh=fresh
        )

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

    # -- device profiles (operations) ---------------------------------------------------------

    def _on_profile(self, item: Inbound) -> None:
        """Apply what can change live; keep the last good profile if this one is invalid."""
        msg = item.message
        assert isinstance(msg, Profile)
        try:
            profile = parse_profile(msg.settings, source=f"profile {msg.digest or '?'} for {self.device_id}")
            if profile.id != self.device_id:
                raise ConfigError(f"profile for {profile.id!r} sent to {self.device_id!r}")
        except ConfigError as exc:
            log.error(
                "%s rejected a profile, keeping %s: %s",
                self.device_id,
                self.profile.digest() if self.profile else "its start-up settings",
                exc,
            )
            self.report_error("profile", str(exc))
            self._restate(f"profile rejected: {exc}")
            return
        restart = profile.needs_restart(self.profile)
        configure_threads(profile.threads)
        self.slowdown = profile.slowdown
        self.link_mbps = profile.link_mbps
        set_link = getattr(self.transport, "set_link_mbps", None)
        if set_link is not None:
            set_link(profile.link_mbps)
        self.set_heartbeat_interval(profile.heartbeat_interval)
        self.set_metrics_interval(profile.metrics_interval)
        self.memory_limit_mb = profile.memory_limit_mb
        self.profile = profile
        if self.session is not None:
            self.session.profile_changed()
        detail = f"profile {profile.digest()} applied"
        if restart:
            detail += f"; restart to apply {restart}"
        log.info("%s: %s", self.device_id, detail)
        self._restate(detail)
        if self.session is None:
            self.announce()  # the birth message carries the profile's hash

    def _restate(self, detail: str) -> None:
        """Publish the current status again with ``detail`` (what became of a profile)."""
        state: StatusState = "training" if self.session else "idle"
        self.set_status(state, run_id=self._status.run_id, stage=self._status.stage, detail=detail)

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
