"""The central node: holds the data, runs stage 0, drives the run (papers/000 Sec. III).

:class:`Central` is the node's lasting part on the role runtime: connection, status, heartbeats,
systemd, liveness stamped on arrival, and discovery of the devices (Sec. III-B). Once the devices are
known it hands the run to the training mode (``--mode``), which it is handed by whoever builds it (a
:data:`~edgeagent.roles.mode.ModeLookup`: the CLI passes the registry, :func:`edgeagent.modes.mode`). The
mode builds its run (the pipeline's :class:`~edgeagent.modes.pipeline.central.run.PipelineRun`, say),
attaches it (its handlers, its metrics) and lets it train; the run's parts live in the mode's package.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from edgeagent.config import PIPELINED_RATE_STALENESS, CentralConfig
from edgeagent.data import Dataset, load_dataset
from edgeagent.errors import (
    ConfigError,
    DivergedError,
    EdgeAgentError,
    PlanningError,
    TrainingError,
)
from edgeagent.models import ModelSpec, num_layers
from edgeagent.ops.signals import StopRequested
from edgeagent.ops.systemd import Notifier, Watchdog, watchdog_interval
from edgeagent.protocol.commands import Stop
from edgeagent.protocol.identity import HasPlan
from edgeagent.protocol.limits import InboxLimits
from edgeagent.protocol.messages import Announce, Event, Message
from edgeagent.protocol.topics import Family, Topics
from edgeagent.roles.central.checkpoint_file import checkpoint_version
from edgeagent.roles.central.devices import DeviceFigures, device_rows
from edgeagent.roles.central.keeper import RunKeeper, pick_run
from edgeagent.roles.central.report import RunReport
from edgeagent.roles.central.roster import DeviceState, Roster
from edgeagent.roles.central.runs import RunDirectory, RunOutcome, settings_digest
from edgeagent.roles.mode import CentralRun, ModeLookup, TrainingMode
from edgeagent.runtime.compute import configure_threads
from edgeagent.runtime.probes import LinkProbes
from edgeagent.runtime.role import Role, mqtt_transport
from edgeagent.transport.base import Transport

if TYPE_CHECKING:
    from edgeagent.ops.prometheus import PrometheusEndpoint

log = logging.getLogger("edgeagent.roles.central")
_FINAL_FIGURES_WAIT = 2.0  # seconds the end of a run waits for the workers' final metrics (the report's)

ProgressHook = Callable[[dict[str, Any]], None]


def _where(transport: Transport) -> str:
    url = getattr(transport, "url", None)
    return url.redacted() if url is not None and hasattr(url, "redacted") else str(url or "?")


def load_run(
    config: CentralConfig, modes: ModeLookup, *, quiet: bool = False
) -> tuple[Dataset, ModelSpec, TrainingMode[Any, Any, Any]]:
    """A run's data set, model and training mode, checked against its number of workers: a user's typo
    (a data set, a model or its options, too many workers) is reported before any broker or device is
    started or waited for (``edgeagent demo`` calls this before it starts them). ``modes`` finds a mode
    by its name (:func:`edgeagent.modes.mode`)."""
    train = config.train
    data = load_dataset(train.dataset, seed=train.seed, test_fraction=train.test_fraction)
    spec = ModelSpec(train.model, data.in_shape, data.num_classes, tuple(sorted(train.model_options.items())))
    chosen = modes(config.mode)
    try:
        chosen.check(spec, config.workers)
    except PlanningError:
        if config.mode != "pipeline" or "mode" in config.model_fields_set:
            raise  # the pipeline mode asked for by name: one device per stage
        # More devices than the model has cut points: stages get several devices (hybrid stages).
        chosen = modes("hybrid")
        chosen.check(spec, config.workers)
        if not quiet:
            log.warning(
                "%d workers for a model of %d layers: more devices than stages, so the run uses hybrid "
                "stages (--mode hybrid: a stage may be held by several devices)",
                config.workers,
                num_layers(spec),
            )
    if train.schedule == "sync" and chosen.name != "pipeline":
        raise ConfigError(
            f"--schedule sync runs in the pipeline mode (one device per stage); this run is {chosen.name} "
            f"({config.workers} workers for a model of {num_layers(spec)} layers): use --schedule async, or "
            "fewer workers"
        )
    return data, spec, chosen


class Central(Role):
    """Runs one training run to its end: ``Central(config, modes=mode).run()`` returns the
    :class:`RunReport`; ``modes`` finds a training mode by its name (:func:`edgeagent.modes.mode`)."""

    def __init__(
        self,
        config: CentralConfig,
        transport: Transport | None = None,
        progress: ProgressHook | None = None,
        *,
        modes: ModeLookup,
        limits: InboxLimits | None = None,
    ) -> None:
        topics = Topics(config.cluster)
        self._owns_transport = transport is None
        if transport is None:
            transport = mqtt_transport(topics, config.device_id, config, link_mbps=config.link_mbps)
        super().__init__(transport, topics, config.device_id, limits=limits)
        self.notifier = Notifier()
        # The runs on disk: checkpoints named by run and version, the cluster's latest run (None: off).
        self.runs = RunDirectory.of(config)
        self.settings = settings_digest(config)  # as configured: what a restart compares
        self.run_id, self.resume, resumed_from = pick_run(config, self.runs, self.settings)
        if self.resume is not None:
            # The run goes on where the checkpoint left it: same run, same training settings.
            config = config.model_copy(
                update={
                    "train": CentralConfig.model_validate_json(self.resume["config"]).train,
                    "resume": resumed_from,
                }
            )
        self.config = config
        self.progress = progress
        self.probes = LinkProbes(self)
        # The devices: announcements, heartbeat intervals, the run's workers and their liveness (roster.py).
        self.roster = Roster(self)
        self.workers: dict[str, DeviceState] = self.roster.workers  # shared: stamped on the network thread
        self.announced: dict[str, Announce] = self.roster.announced
        self.heartbeat_intervals: dict[str, float] = self.roster.heartbeat_intervals
        # The run on disk: its record, its checkpoints, SIGTERM's suspension (keeper.py).
        self.keeper = RunKeeper(
            self.runs,
            self.run_id,
            self.settings,
            event=self.event,
            flush=self.transport.flush,
            die_after=config.die_after_checkpoint,
        )
        self.modes = modes
        self.mode = modes(config.mode)  # the training mode (edgeagent.modes): a strategy over this runtime
        self.active: CentralRun | None = None  # the mode's run, once its devices are known
        # Messages of this run dropped because they held values that are not finite, by the device that
        # sent them: dropped here (on_nonfinite) or reported by the worker that dropped them.
        self.nonfinite: Counter[str] = Counter()
        self.figures = DeviceFigures(self.transport, self.topics, self.run_id)  # every device's metrics

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> RunReport:
        started = time.perf_counter()
        configure_threads(self.config.threads)
        torch.manual_seed(self.config.train.seed)
        # The user's choices first (data, model, enough layers): a typo is reported before any wait.
        try:
            data, spec, self.mode = load_run(self.config, self.modes)
        except (EdgeAgentError, ValueError):
            if self._owns_transport:
                self.transport.close()
            raise
        self.listen(self.topics.devices(Family.ANNOUNCE))
        for family in (Family.HEARTBEAT, Family.STATUS, Family.REPLY, Family.REQUEST):
            self.listen(self.topics.devices(family))
        if not self.transport.wait_connected(self.config.startup_timeout):
            raise TrainingError(
                f"no broker at {_where(self.transport)} after "
                f"{self.config.startup_timeout:.0f} s; start one or pass --broker"
            )
        self.keeper.record("running")
        self.set_status("training", run_id=self.run_id, stage=0)
        self.pulse.start(self.config.heartbeat_interval)
        self.pulse.start_metrics(self.config.metrics_interval, self._metrics)
        if self.resume is not None:
            self.event("run-resumed", version=checkpoint_version(self.resume), checkpoint=self.config.resume)
        # Under systemd (Type=notify): ready once connected; the watchdog is petted only while the MQTT
        # loop and the scheduler are healthy, as on the workers.
        self.notifier.ready(f"{self.device_id} running {self.run_id} on {self.topics.base}")
        interval = watchdog_interval()
        watchdog = Watchdog(self.notifier, self.pulse.healthy, interval).start() if interval else None
        prometheus = serve_prometheus(self.config, self.transport, self.topics)
        outcome: RunOutcome = "running"  # an error leaves the run resumable: a restart goes on with it
        report: RunReport | None = None
        try:
            chosen = self.roster.discover(self.config.workers, spec)
            self.config = take_learning_rate(self.config, len(chosen) + 1)
            devices = [self.device_id, *chosen]
            report = self._drive(self.mode.start(self, data, spec, devices))
            report.wall_seconds = time.perf_counter() - started
            outcome = "finished"
            return report
        except StopRequested:
            if outcome != "finished":
                outcome = "suspended"
                self.keeper.suspend(self.active)
            raise
        except DivergedError:
            outcome = "diverged"  # resuming it would diverge again
            raise
        finally:
            if watchdog is not None:
                watchdog.stop()
            self._finish(outcome)
            if report is not None:
                report.devices = self._device_rows()
            if prometheus is not None:
                prometheus.close()

    def _finish(self, outcome: RunOutcome) -> None:
        if outcome != "running":
            self.keeper.record(outcome)
        self.notifier.send("STOPPING=1")
        self.pulse.publish_metrics()  # the final figures of this run
        self.intake.report_drops()
        if outcome == "suspended":
            # Not "idle" and no "stop": the run is not over. Workers leave it and announce themselves
            # idle, and the next central node of this run takes them back (roles.worker.central_watch).
            detail = "suspended; starting the central node again resumes it"
            self.set_status("left", run_id=self.run_id, detail=detail)
        else:
            if self.active is not None and self.active.worker_list[1:]:
                seen = self.figures.seen()
                self.send(self.topics.fixed(Family.COMMAND), Stop(run_id=self.run_id))
                self._await_final_figures(seen)
            self.set_status("idle")  # the run is over (workers leave a run whose central node is idle)
        self.pulse.stop()
        self.probes.unwatch_all()
        if self._owns_transport:
            if outcome != "suspended":
                self.set_status("left")  # the process leaves: monitors stop listing it as a live device
            self.transport.close()

    def event(self, name: str, **details: Any) -> None:
        """Tell monitors (``run/events``) what happened to the run as a whole."""
        self.send(self.topics.fixed(Family.EVENTS), Event(name=name, run_id=self.run_id, details=details))

    @property
    def checkpointing(self) -> bool:
        """Whether the run writes checkpoints (``--checkpoint``)."""
        return self.runs is not None

    def save_checkpoint(self, version: int, state: dict[str, Any], what: str) -> bool:
        """Write the run's checkpoint of ``version`` (:meth:`RunKeeper.save`: a disk that refuses it is one
        error line and the run trains on)."""
        return self.keeper.save(version, state, what)

    def _drive(self, run: CentralRun) -> RunReport:
        """The mode's run takes the node's messages and trains to its report; ``--save-model``: then its
        model. What comes after (stop, the final figures, the node's status) is :meth:`_finish`'s."""
        self.attach(run)
        report: RunReport = run.execute()
        if self.config.save_model:
            run.save_model(self.config.save_model)
        return report

    def attach(self, run: CentralRun) -> None:
        """The mode's run starts: its handlers take over the messages, its metrics are published."""
        self.active = run
        # Stage outputs are taken only from the devices the run's plan says hold the stage.
        self.senders.plan = run.plan_view if isinstance(run, HasPlan) else None
        for kind, handler in run.handlers().items():
            self.on(kind, handler)

    def _metrics(self) -> dict[str, Any] | None:
        return self.active.metrics() if self.active is not None else None

    def _await_final_figures(self, seen: dict[str, int]) -> None:
        """The workers answer ``stop`` with their final metrics: wait for them (briefly; only from workers
        still online, and only when metrics are on), so that the report's devices hold the whole run."""
        if self.active is None or self.config.metrics_interval <= 0:
            return
        online = [d for d in self.active.worker_list[1:] if d in self.workers and self.workers[d].online]
        if online and not self.figures.wait_newer(online, seen, _FINAL_FIGURES_WAIT):
            log.debug("not every worker sent its final metrics; the report keeps their latest")

    def _device_rows(self) -> list[dict[str, Any]]:
        """The report's devices: each device's last figures (this node's own, taken now)."""
        latest = self.figures.latest()
        own = self._metrics()
        latest[self.device_id] = {**self.times.figures(), **(own or {})}
        order = list(self.active.worker_list) if self.active is not None else [self.device_id]
        pairs = getattr(self.active, "stage_time_pairs", None)  # the pipeline modes: predicted, measured
        return device_rows(latest, order, pairs() if callable(pairs) else None)

    def collect_weights(self) -> dict[str, torch.Tensor]:
        """The trained model's state, gathered from every device of the run (keys ``<layer>.<name>``)."""
        if self.active is None:
            raise TrainingError("no run: collect_weights needs a run that has started")
        return self.active.collect_weights()

    # -- devices -------------------------------------------------------------------------------

    def remember(self, msg: Announce, *, keep: list[str]) -> None:
        """Keep ``msg`` as the device's latest announcement (:meth:`Roster.remember`: bounded, never
        forgetting the devices in ``keep``)."""
        self.roster.remember(msg, keep=keep)

    def on_nonfinite(self, sender: str, message: Message, problem: str) -> None:
        if getattr(message, "run_id", None) == self.run_id:
            self.nonfinite[sender] += 1

    def on_arrival(self, sender: str, message: Message) -> None:
        # Network thread: liveness is stamped on arrival (see Role.on_arrival and Roster.stamp).
        self.roster.stamp(sender, message, self.run_id)


def take_learning_rate(config: CentralConfig, devices: int) -> CentralConfig:
    """The model's pipelined rate, where no rate was set, scaled to the run's depth (``for_devices``)."""
    if not config.model_rate:
        return config
    train = config.train
    scaled = config.for_devices(devices)
    rate = scaled.train.learning_rate
    deeper = ""
    if rate != train.learning_rate:
        in_flight = train.in_flight or devices
        deeper = f", x{rate / train.learning_rate:.2f} for {in_flight} batches in flight"
    log.info(
        "learning rate %.3g: %s's pipelined rate (--pipelined-rate: %g up to %d stages%s; "
        "--learning-rate sets another)",
        rate,
        train.model,
        train.learning_rate,
        PIPELINED_RATE_STALENESS + 1,
        deeper,
    )
    return scaled


def serve_prometheus(
    config: CentralConfig, transport: Transport, topics: Topics
) -> PrometheusEndpoint | None:
    """``--prometheus-port``: the cluster's metrics for Prometheus to scrape (None: off)."""
    if config.prometheus_port is None:
        return None
    from edgeagent.ops.prometheus import PrometheusEndpoint

    return PrometheusEndpoint(transport, topics, config.prometheus_port)


__all__ = ["Central", "DeviceState", "ProgressHook", "load_run", "serve_prometheus", "take_learning_rate"]
