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
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from edgeagent.config import CHARACTERISE_ROUNDS, PIPELINED_RATE_STALENESS, CentralConfig
from edgeagent.data import Dataset, load_dataset
from edgeagent.errors import (
    ConfigError,
    DivergedError,
    EdgeAgentError,
    PlanningError,
    StorageError,
    TrainingError,
)
from edgeagent.models import ModelSpec, num_layers
from edgeagent.ops.signals import StopRequested
from edgeagent.ops.systemd import Notifier, Watchdog, watchdog_interval
from edgeagent.predictor.measure import (
    ModelLayers,
    characterise_bound,
    characterise_ranges,
    model_key,
    time_range,
)
from edgeagent.predictor.store import shipped_path
from edgeagent.protocol.commands import Stop
from edgeagent.protocol.identity import HasPlan
from edgeagent.protocol.limits import InboxLimits
from edgeagent.protocol.messages import Announce, Discover, Event, Heartbeat, Message, Status
from edgeagent.protocol.topics import Family, Topics
from edgeagent.roles.central.checkpoint_file import checkpoint_version, load_checkpoint
from edgeagent.roles.central.devices import DeviceFigures, device_rows
from edgeagent.roles.central.report import RunReport
from edgeagent.roles.central.runs import RunDirectory, RunOutcome, RunRecord, settings_digest
from edgeagent.roles.mode import CentralRun, ModeLookup, TrainingMode
from edgeagent.runtime.compute import configure_threads
from edgeagent.runtime.probes import LinkProbes
from edgeagent.runtime.role import Inbound, Role
from edgeagent.transport.base import Transport

if TYPE_CHECKING:
    from edgeagent.ops.prometheus import PrometheusEndpoint

log = logging.getLogger("edgeagent.roles.central")
_MAX_ANNOUNCED = 1024  # devices remembered from their announcements (the run's own are never dropped)
_FINAL_FIGURES_WAIT = 2.0  # seconds the end of a run waits for the workers' final metrics (the report's)

ProgressHook = Callable[[dict[str, Any]], None]


def _where(transport: Transport) -> str:
    url = getattr(transport, "url", None)
    return url.redacted() if url is not None and hasattr(url, "redacted") else str(url or "?")


@dataclass
class DeviceState:
    """What the central node knows of one worker: liveness (stamped on the network thread) and what it
    announced (emulated slowdown, memory limit)."""

    device_id: str
    last_heartbeat: float
    slowdown: float = 1.0
    memory_limit: float = 0.0
    online: bool = True
    heartbeat_interval: float = 0.0  # the device's own, as its heartbeats say (0: none seen yet)


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


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
            transport = Role.mqtt_transport(topics, config.device_id, config, link_mbps=config.link_mbps)
        super().__init__(transport, topics, config.device_id, limits=limits)
        self.notifier = Notifier()
        # The runs on disk: checkpoints named by run and version, the cluster's latest run (None: off).
        self.runs = RunDirectory.of(config)
        self.settings = settings_digest(config)  # as configured: what a restart compares
        self.run_id, self.resume, resumed_from = self._pick_run(config)
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
        self.workers: dict[str, DeviceState] = {}  # the run's devices; liveness stamped on arrival
        self._own_h_seconds: float | None = None  # at most what measuring h here takes (the h wait's unit)
        self.announced: dict[str, Announce] = {}  # what devices announced (joins, restarts)
        self.modes = modes
        self.mode = modes(config.mode)  # the training mode (edgeagent.modes): a strategy over this runtime
        self.active: CentralRun | None = None  # the mode's run, once its devices are known
        self._checkpoints = 0  # written by this process (--die-after-checkpoint counts them)
        # Messages of this run dropped because they held values that are not finite, by the device that
        # sent them: dropped here (on_nonfinite) or reported by the worker that dropped them.
        self.nonfinite: Counter[str] = Counter()
        # Every device's own heartbeat interval, as its heartbeats say (liveness waits for its own, not
        # ours: a device profile may set up to 60 s); bounded like the announcements.
        self.heartbeat_intervals: dict[str, float] = {}
        self.figures = DeviceFigures(self.transport, self.topics, self.run_id)  # every device's metrics

    def _pick_run(self, config: CentralConfig) -> tuple[str, dict[str, Any] | None, str | None]:
        """(run id, loaded checkpoint, its path): ``--resume FILE``'s; else the cluster's latest run if it
        can be resumed (:mod:`.runs`: a restart goes on with its own run by itself); else a new run."""
        if config.resume:
            state = load_checkpoint(config.resume)
            return str(state["run_id"]), state, config.resume
        found = None if self.runs is None or config.fresh else self.runs.resumable(self.settings)
        if found is None:
            return new_run_id(), None, None
        if found.state is None or found.path is None:
            log.warning(
                "run %s stopped before its first checkpoint: starting it again from its first batch, under "
                "its own id so that its workers rejoin (--fresh: a new run)",
                found.run_id,
            )
            return found.run_id, None, None
        log.info(
            "resuming run %s from its checkpoint %s (version %s); --fresh starts a new run instead",
            found.run_id,
            found.path,
            checkpoint_version(found.state),
        )
        return found.run_id, found.state, str(found.path)

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> RunReport:
        started = time.perf_counter()
        configure_threads(self.config.threads)
        torch.manual_seed(self.config.train.seed)
        # The user's choices first (data, model, enough layers): a typo is reported before any wait.
        try:
            data, spec = self._load()
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
        self._record("running")
        self.set_status("training", run_id=self.run_id, stage=0)
        self.start_heartbeats(self.config.heartbeat_interval)
        self.start_metrics(self.config.metrics_interval, self._metrics)
        if self.resume is not None:
            self.event("run-resumed", version=checkpoint_version(self.resume), checkpoint=self.config.resume)
        # Under systemd (Type=notify): ready once connected; the watchdog is petted only while the MQTT
        # loop and the scheduler are healthy, as on the workers.
        self.notifier.ready(f"{self.device_id} running {self.run_id} on {self.topics.base}")
        interval = watchdog_interval()
        watchdog = Watchdog(self.notifier, self.healthy, interval).start() if interval else None
        prometheus = self._serve_prometheus()
        outcome: RunOutcome = "running"  # an error leaves the run resumable: a restart goes on with it
        report: RunReport | None = None
        try:
            devices = [self.device_id, *self._discover(self.config.workers, spec)]
            report = self.mode.run(self, data, spec, devices)
            report.wall_seconds = time.perf_counter() - started
            outcome = "finished"
            return report
        except StopRequested:
            if outcome != "finished":
                outcome = "suspended"
                self._suspend()
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

    def _serve_prometheus(self) -> PrometheusEndpoint | None:
        if self.config.prometheus_port is None:
            return None
        from edgeagent.ops.prometheus import PrometheusEndpoint

        return PrometheusEndpoint(self.transport, self.topics, self.config.prometheus_port)

    def _load(self) -> tuple[Dataset, ModelSpec]:
        """The data set and the model, checked against the number of devices before anything waits."""
        data, spec, self.mode = load_run(self.config, self.modes)
        return data, spec

    def _finish(self, outcome: RunOutcome) -> None:
        if outcome != "running":
            self._record(outcome)
        self.notifier.send("STOPPING=1")
        self.publish_metrics()  # the final figures of this run
        self.report_drops()
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
        self.stop_heartbeats()
        self.probes.unwatch_all()
        if self._owns_transport:
            if outcome != "suspended":
                self.set_status("left")  # the process leaves: monitors stop listing it as a live device
            self.transport.close()

    def _suspend(self) -> None:
        """SIGTERM: the newest consistent state on disk (the mode's run writes it if it holds a newer one
        than its last checkpoint), and the run said to be suspended, not finished."""
        write = getattr(self.active, "checkpoint_newest", None)  # the pipeline modes: replication points
        version = None
        try:
            version = write() if callable(write) else None
        except Exception:  # a bug here must not keep the run from being said suspended, nor the exit
            log.exception("SIGTERM: the newest state could not be checkpointed; the last checkpoint stands")
        if version is None and self.runs is not None:
            version = self.runs.newest(self.run_id)
        where = ""
        if version is not None and self.runs is not None:
            where = str(self.runs.run_folder(self.run_id) / f"v{version:08d}.ckpt")
        self.event("run-suspended", version=version, checkpoint=where, reason="SIGTERM")
        if where:
            log.warning(
                "SIGTERM: run %s suspended at version %d (%s); start the central node again with the same "
                "configuration to resume it (--fresh: a new run)",
                self.run_id,
                version,
                where,
            )
        else:
            log.warning(
                "SIGTERM: run %s suspended before its first checkpoint%s; starting the central node again "
                "starts it from its first batch",
                self.run_id,
                "" if self.runs is not None else " (checkpoints are off: --checkpoint DIR)",
            )

    def _record(self, outcome: RunOutcome) -> None:
        """The cluster's run record: this run and what became of it (a restart reads it: :mod:`.runs`)."""
        if self.runs is not None:
            self.runs.set_record(RunRecord(self.run_id, self.settings, outcome))

    def event(self, name: str, **details: Any) -> None:
        """Tell monitors (``run/events``) what happened to the run as a whole."""
        self.send(self.topics.fixed(Family.EVENTS), Event(name=name, run_id=self.run_id, details=details))

    @property
    def checkpointing(self) -> bool:
        """Whether the run writes checkpoints (``--checkpoint``)."""
        return self.runs is not None

    def save_checkpoint(self, version: int, state: dict[str, Any], what: str) -> bool:
        """Write the run's checkpoint of ``version`` (:meth:`RunDirectory.save`); a disk that refuses it is
        one error line and the run trains on (the previous checkpoint stays, the next one may fit)."""
        if self.runs is None:
            return False
        try:
            path = self.runs.save(self.run_id, version, state)
        except StorageError as exc:
            log.error("%s; training goes on", exc)
            self.event("checkpoint-failed", version=version, reason=str(exc))
            return False
        if path is None:
            return False
        self.checkpoint_written(str(path), what, version)
        return True

    def checkpoint_written(self, path: str, what: str, version: int) -> None:
        """Log and announce a checkpoint the run wrote; ``--die-after-checkpoint N`` (fault injection):
        SIGKILL this process right after the N-th, what it sent before delivered first."""
        log.info("checkpoint %s written to %s", what, path)
        self.event("checkpoint", version=version, path=path)
        self._checkpoints += 1
        if self.config.die_after_checkpoint == self._checkpoints:
            log.warning("fault injection: SIGKILL after checkpoint %d (%s)", self._checkpoints, what)
            self.transport.flush(5.0)
            os.kill(os.getpid(), signal.SIGKILL)

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

    def _discover(self, wanted: int, spec: ModelSpec) -> list[str]:
        """Ask devices to announce themselves until ``wanted`` idle workers answered. With the latency
        predictor the request names the model and batch size, and every worker answers with its ``h``
        (papers/004 Sec. 3.2): the wait for those is bounded (see :meth:`_h_wait`); a device whose ``h``
        did not come is planned by FTPipeHD's capacity estimate."""
        if wanted == 0:
            return []
        found: dict[str, Announce] = {}
        request = self._h_request(spec)
        key = model_key(spec)

        def has_h(msg: Announce) -> bool:
            return msg.h_key == key and msg.h_batch == self.config.train.batch_size and len(msg.h) > 0

        def on_announce(item: Inbound) -> None:
            msg = item.message
            assert isinstance(msg, Announce)
            # Idle devices, or (after the central node itself restarted) devices still in this run.
            if msg.busy_with in ("", self.run_id) and msg.device_id != self.device_id:
                old = found.get(msg.device_id)
                if old is None or has_h(msg) or not has_h(old):
                    found[msg.device_id] = msg

        next_ask = 0.0
        h_deadline: float | None = None

        def enough() -> bool:
            nonlocal next_ask, h_deadline
            now = time.monotonic()
            if len(found) >= wanted:
                if request is None or all(has_h(found[d]) for d in sorted(found)[:wanted]):
                    return True
                if h_deadline is None:
                    h_deadline = now + self._h_wait(spec)
                    log.info("waiting up to %.0f s for the workers' h", h_deadline - now)
                elif now >= h_deadline:
                    return True
            if now >= next_ask:
                model, batch = request if request is not None else ({}, 0)
                self.send(
                    self.topics.fixed(Family.DISCOVER),
                    Discover(run_id=self.run_id, model=model, batch_size=batch),
                )
                next_ask = now + 2.0
            return False

        log.info("waiting for %d worker(s) on %s", wanted, self.topics.base)
        self.on(Announce, on_announce)
        self.wait_until(
            enough,
            self.config.startup_timeout + (self._h_wait(spec) if request is not None else 0.0),
            lambda: (
                f"only {len(found)} of {wanted} workers announced themselves ({sorted(found)}); start "
                f"more with `edgeagent worker --broker URL --cluster {self.topics.cluster}`"
            ),
        )
        # The worker list is ordered by device id so that a re-run gives the same pipeline.
        chosen = sorted(found)[:wanted]
        now = time.monotonic()
        for d in chosen:
            self.workers[d] = DeviceState(
                d,
                now,
                slowdown=found[d].slowdown,
                memory_limit=found[d].memory_limit,
                heartbeat_interval=self.heartbeat_intervals.get(d, 0.0),
            )
            self.remember(found[d], keep=chosen)
        log.info("workers: %s", ", ".join(chosen))
        self._take_learning_rate(len(chosen) + 1)
        return chosen

    def _take_learning_rate(self, devices: int) -> None:
        """The model's pipelined rate, where no rate was set, scaled to the run's depth (``for_devices``)."""
        config = self.config
        if not config.model_rate:
            return
        train = config.train
        self.config = config.for_devices(devices)
        rate = self.config.train.learning_rate
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

    def _h_request(self, spec: ModelSpec) -> tuple[dict[str, Any], int] | None:
        """The model and batch size the workers measure ``h`` for, when the run uses the predictor."""
        config = self.config
        if (
            config.estimator != "predictor"
            or config.partition != "dynamic"
            or not shipped_path(spec).exists()
        ):
            return None
        return spec.to_dict(), config.train.batch_size

    def _h_wait(self, spec: ModelSpec) -> float:
        """How long to wait for the workers' ``h`` once they answered: 60 times what measuring it would take
        on the central node (a Pi is 10-50x slower), at least 20 s. That time is bounded from one
        forward+backward of the whole model (:func:`characterise_bound`), once per run: measuring ``h``
        here would hold up the discovery for as long as the workers take to measure theirs."""
        if self._own_h_seconds is None:
            model = ModelLayers.build(spec, self.config.train.batch_size)
            slowdown = self.config.slowdown
            step = time_range(model, 0, model.num_layers, reps=1, slowdown=slowdown, min_seconds=0)
            ranges = sum(map(len, characterise_ranges(model)))
            self._own_h_seconds = characterise_bound(step, ranges, rounds=CHARACTERISE_ROUNDS)
        return max(20.0, 60.0 * self._own_h_seconds)

    def remember(self, msg: Announce, *, keep: list[str]) -> None:
        """Keep ``msg`` as the device's latest announcement; bounded (forged ids must not grow it forever),
        never forgetting the devices in ``keep``."""
        self.announced.pop(msg.device_id, None)
        self.announced[msg.device_id] = msg
        while len(self.announced) > _MAX_ANNOUNCED:
            oldest = next(d for d in self.announced if d not in keep)
            del self.announced[oldest]

    def _note_interval(self, device: str, interval: float) -> None:
        """Network thread: ``device`` beats every ``interval`` seconds (a profile may change it)."""
        intervals = self.heartbeat_intervals
        if device not in intervals and len(intervals) >= _MAX_ANNOUNCED:
            keep = set(self.workers)
            oldest = next((d for d in intervals if d not in keep), None)
            if oldest is None:
                return
            del intervals[oldest]
        intervals[device] = interval
        w = self.workers.get(device)
        if w is not None:
            w.heartbeat_interval = interval

    def on_nonfinite(self, sender: str, message: Message, problem: str) -> None:
        if getattr(message, "run_id", None) == self.run_id:
            self.nonfinite[sender] += 1

    def on_arrival(self, sender: str, message: Message) -> None:
        # Network thread: liveness is stamped on arrival (see Role.on_arrival). Any message from a
        # worker is a sign of life, not only heartbeats: on a saturated slow uplink its heartbeats
        # wait behind the activations in the same TCP stream.
        if isinstance(message, Heartbeat) and message.device_id == sender:
            self._note_interval(sender, message.interval)
        w = self.workers.get(sender)
        if isinstance(message, Status) and message.state == "offline":
            if w is not None:
                w.online = False
            return
        if w is not None and (
            isinstance(message, Heartbeat) or getattr(message, "run_id", None) == self.run_id
        ):
            w.last_heartbeat = time.monotonic()
            w.online = True
