"""The central node: holds the data, runs stage 0, drives the pipeline, re-splits it and evaluates.

Initialization follows papers/000 Sec. III-B: discover workers, form the ordered worker list, profile
the layers, make the initial (equal-device) partition, send every worker the Table I state, wait until
all have built their stages, and measure every link along the path data takes (through the broker).
Training follows Sec. III-C (1F1B, a bound on batches in flight, weight stashing, vertical sync) and
Sec. III-D: after ``repartition_first`` batches of epoch 0 and then every ``repartition_every``
batches, capacities are estimated from the stage times that ride with the gradients (eq. 1-3), the DP
(eq. 4-7) proposes a split, and if the predicted gain beats the cost of moving the weights, the
pipeline drains and every device fetches the layers it lacks before a commit barrier.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import pickle  # only for its exception: torch.load(weights_only=True) raises it
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from edgeagent.compression.schedule import stage_bits
from edgeagent.compression.stage import NONE, StageCodecs
from edgeagent.config import CentralConfig, parse_slowdown_change
from edgeagent.data import Dataset, batch_indices, batches_per_epoch, load_dataset
from edgeagent.errors import EdgeAgentError, PlanningError, TrainingError
from edgeagent.models import ModelSpec, build_model, num_layers
from edgeagent.ops.systemd import Notifier, Watchdog, watchdog_interval
from edgeagent.pipeline.build import TrainOptions, build_stage, layer_slice
from edgeagent.pipeline.runner import StageRunner
from edgeagent.pipeline.schedule import admit
from edgeagent.pipeline.stage import Stage
from edgeagent.planner.capacity import capacities
from edgeagent.planner.deadlines import Deadlines
from edgeagent.planner.dp import Link, Problem, compute_time, predict, solve
from edgeagent.planner.partition import balanced_partition
from edgeagent.planner.policy import RepartitionPolicy, choose_plan
from edgeagent.planner.profiler import LayerProfile, profile_layers
from edgeagent.planner.recovery import (
    choose_recovery_point,
    classify_probe,
    new_worker_list,
    respipe_points,
)
from edgeagent.protocol.limits import InboxLimits
from edgeagent.protocol.messages import (
    Announce,
    Assign,
    Collect,
    Commit,
    Discover,
    Emulate,
    ErrorReport,
    EvalResult,
    Event,
    FetchRequest,
    Gradient,
    Heartbeat,
    LinkReport,
    MeasureLink,
    Message,
    Ping,
    Ready,
    Repartition,
    SetCompression,
    Status,
    Stop,
    Weights,
)
from edgeagent.protocol.topics import Family, Topics
from edgeagent.replication.store import WeightStore
from edgeagent.replication.switch import Switch, serve_fetch
from edgeagent.runtime.compute import Clock, configure_threads, emulate_slowdown
from edgeagent.runtime.probes import LinkProbes
from edgeagent.runtime.role import Inbound, Role
from edgeagent.transport.base import Transport

log = logging.getLogger(__name__)
_MAX_ANNOUNCED = 1024  # devices remembered from their announcements (the run's own are never dropped)

ProgressHook = Callable[[dict[str, Any]], None]


@dataclass
class RunReport:
    """What ``--report`` writes (JSON)."""

    run_id: str
    model: str
    dataset: str
    workers: list[str]
    final_accuracy: float = 0.0
    test_accuracy_per_epoch: list[float] = field(default_factory=list)
    test_loss_per_epoch: list[float] = field(default_factory=list)
    train_loss_per_epoch: list[float] = field(default_factory=list)
    samples_per_second: float = 0.0
    batches: int = 0
    epochs: int = 0
    wall_seconds: float = 0.0
    train_seconds: float = 0.0
    partitions: list[dict[str, Any]] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    partition_mode: str = "dynamic"
    in_flight: int = 0
    aggregation: bool = True
    links: list[dict[str, float]] = field(default_factory=list)
    compression: str = "none"
    compression_ratio: float = 1.0  # uncompressed / sent bytes of stage 0's activation messages (envelope in)
    compression_ratio_tensors: float = 1.0  # the same for the tensors alone (codec parameters in)
    layer_profile: dict[str, Any] = field(default_factory=dict)
    timeline: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class _Worker:
    device_id: str
    last_heartbeat: float
    slowdown: float = 1.0
    memory_limit: float = 0.0
    online: bool = True


def _where(transport: Transport) -> str:
    url = getattr(transport, "url", None)
    return url.redacted() if url is not None and hasattr(url, "redacted") else str(url or "?")


def load_checkpoint(path: str) -> dict[str, Any]:
    """A checkpoint written by the central node; only tensors and plain data (``weights_only=True``)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise TrainingError(f"cannot read the checkpoint {path}: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != 1:
        raise TrainingError(f"{path} is not an edgeagent checkpoint (format 1)")
    return state


@dataclass(frozen=True)
class Plan:
    """What the planning job proposes: a split over a worker list (longer than now if devices joined)."""

    points: list[int]
    predicted: float
    reason: str
    workers: list[str]


class _Fault(Exception):
    """Raised inside the training loop when a fault is detected; caught by the loop, which recovers."""

    def __init__(self, dead: list[str], reason: str) -> None:
        super().__init__(reason)
        self.dead = dead
        self.reason = reason


class Central(Role):
    """Runs one training run to its end: ``Central(config).run()`` returns the :class:`RunReport`."""

    def __init__(
        self,
        config: CentralConfig,
        transport: Transport | None = None,
        progress: ProgressHook | None = None,
        *,
        limits: InboxLimits | None = None,
    ) -> None:
        topics = Topics(config.cluster)
        self._owns_transport = transport is None
        if transport is None:
            transport = Role.mqtt_transport(topics, config.device_id, config, link_mbps=config.link_mbps)
        super().__init__(transport, topics, config.device_id, limits=limits)
        self._notifier = Notifier()
        self._watchdog: Watchdog | None = None
        self._resume = load_checkpoint(config.resume) if config.resume else None
        if self._resume is not None:
            # The run goes on where the checkpoint left it: same run, same training settings.
            config = config.model_copy(
                update={"train": CentralConfig.model_validate_json(self._resume["config"]).train}
            )
        self.config = config
        self.train = config.train
        self.run_id = self._resume["run_id"] if self._resume else uuid.uuid4().hex[:12]
        self._start_version = int(self._resume["version"]) if self._resume else 0
        # Plan ids above the dead central node's, so that no stale message of its plans is taken.
        self.plan_id = int(self._resume["plan_id"]) + 1 if self._resume else 0
        self.progress = progress
        self.workers: dict[str, _Worker] = {}
        self.worker_list: list[str] = []
        self.points: list[int] = []
        self.links: list[Link] = []
        self.probes = LinkProbes(self)
        self.store = WeightStore(config.device_id)
        self._alive: dict[str, Ready] = {}
        self._announced: dict[str, Announce] = {}
        self.status = 0  # Table I: 1 while recovering from a fault
        self._grace_until = 0.0
        self._plan_counter = self.plan_id
        self._report: RunReport | None = None
        self._train_started = 0.0
        self._eval_seconds = 0.0
        self._last_progress = 0.0
        self.policy = RepartitionPolicy(config.repartition_first, config.repartition_every)
        self.deadlines = Deadlines(config.timeout_multiplier, config.batch_timeout, config.probe_timeout)
        self._batch_deadline = config.batch_timeout  # from the measured step: see _refresh_deadline
        self._known_caps: dict[str, float] = {}  # the latest measured capacity of every device
        self._params: tuple[int, ...] | None = None  # parameter bytes per layer (built once)
        self.options = TrainOptions(
            learning_rate=self.train.learning_rate,
            momentum=self.train.momentum,
            weight_decay=self.train.weight_decay,
            aggregation=self.train.aggregation,
            aggregation_interval=self.train.aggregation_interval,
        )
        self.changes = sorted((parse_slowdown_change(c) for c in config.slowdown_changes), key=lambda c: c[1])
        self._spec: ModelSpec | None = None
        self._profile: LayerProfile | None = None
        self._gradients: dict[int, Gradient] = {}
        self._results: dict[int, EvalResult] = {}
        self._weights: dict[str, Weights] = {}
        self._links: dict[str, LinkReport] = {}
        self._ready: dict[int, dict[str, str]] = {}  # plan id -> device -> phase
        self._sent_at: dict[int, float] = {}
        self._eval_ids: set[int] = set()  # evaluation batches whose results are due
        self._stage_times: list[float] = []  # latest per-stage seconds per batch, stage 1 onwards
        self._plan_job: Future[Plan] | None = None
        self.codecs = StageCodecs()
        self._per_epoch = 0
        self._bits: tuple[list[int], list[int]] | None = None
        self._joiners: list[str] = []
        self._switch: Switch | None = None
        self._runner: StageRunner | None = None  # stage 0 and its data path (pipeline/runner.py)

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> RunReport:
        started = time.perf_counter()
        configure_threads(self.config.threads)
        torch.manual_seed(self.train.seed)
        # The user's choices first (data, model, enough layers): a typo is reported before any wait.
        try:
            data, spec = self._load()
        except (EdgeAgentError, ValueError):
            if self._owns_transport:
                self.transport.close()
            raise
        self.listen(self.topics.fixed(Family.ANNOUNCE))
        for family in (Family.HEARTBEAT, Family.STATUS, Family.REPLY, Family.REQUEST):
            self.listen(self.topics.devices(family))
        if not self.transport.wait_connected(self.config.startup_timeout):
            raise TrainingError(
                f"no broker at {_where(self.transport)} after "
                f"{self.config.startup_timeout:.0f} s; start one or pass --broker"
            )
        self.set_status("training", run_id=self.run_id, stage=0)
        self.start_heartbeats(self.config.heartbeat_interval)
        self.start_metrics(self.config.metrics_interval, self._metrics)
        # Under systemd (Type=notify): ready once connected; the watchdog is petted only while the MQTT
        # loop and the scheduler are healthy, as on the workers.
        self._notifier.ready(f"{self.device_id} running {self.run_id} on {self.topics.base}")
        interval = watchdog_interval()
        self._watchdog = Watchdog(self._notifier, self.healthy, interval).start() if interval else None
        try:
            self.worker_list = [self.device_id, *self._discover(self.config.workers)]
            self._profile = profile = self._profile_layers(spec, data)
            self.points = self._initial_points(profile)
            if self._resume is not None and len(self._resume["points"]) == len(self.worker_list) + 1:
                self.points = list(self._resume["points"])
            report = RunReport(
                run_id=self.run_id,
                model=self.train.model,
                dataset=data.name,
                workers=self.worker_list[1:],
                in_flight=self._bound(),
                aggregation=self.train.aggregation,
                layer_profile=profile.to_dict(),
                partition_mode=self.config.partition,
            )
            self._report = report
            if self._resume is not None:
                for key in ("test_accuracy_per_epoch", "test_loss_per_epoch", "train_loss_per_epoch"):
                    getattr(report, key).extend(self._resume["history"][key])
                report.recoveries.append(
                    {
                        "case": "central",
                        "resumed_from": self._resume["version"],
                        "checkpoint": self.config.resume,
                    }
                )
            self._runner = StageRunner(self._setup(spec), 0, codecs=self.codecs)
            if self.config.home_assistant:
                self._announce_to_home_assistant()
            self.links = self._measure_links()
            report.links = [{"bandwidth": lk.bandwidth, "latency": lk.latency} for lk in self.links]
            self._apply_compression(epoch=self._start_version // max(1, self._per_epoch))
            self._record_partition(
                report,
                self._start_version,
                "resumed from a checkpoint" if self._resume else "initial: equal devices (PipeDream)",
            )
            if self.config.partition == "oracle" and len(self.worker_list) > 1:
                points = self._solve(self._problem(self._true_capacities()))
                if points != self.points:
                    self._switch_to(points, version=0)
                self._record_partition(report, 0, "oracle: the DP fed the true slowdowns")
            self._train(data, report)
            report.wall_seconds = time.perf_counter() - started
            if self.config.save_model:
                self._save_model(spec)
            return report
        finally:
            self._finish()

    def _load(self) -> tuple[Dataset, ModelSpec]:
        """The data set and the model, checked against the number of devices before anything waits."""
        data = load_dataset(self.train.dataset, seed=self.train.seed, test_fraction=self.train.test_fraction)
        spec = ModelSpec(
            self.train.model, data.in_shape, data.num_classes, tuple(sorted(self.train.model_options.items()))
        )
        layers = num_layers(spec)
        if self.config.workers + 1 > layers:
            raise PlanningError(
                f"model {spec.name!r} has {layers} layers: it cannot be split over the central node and "
                f"{self.config.workers} workers (at most {layers - 1}); start fewer workers "
                "(--workers) or pick a deeper model (--model, --model-option)"
            )
        self._spec = spec
        self._per_epoch = batches_per_epoch(data.x_train.shape[0], self.train.batch_size)
        return data, spec

    @property
    def stage(self) -> Stage:
        return self.runner.stage

    @property
    def runner(self) -> StageRunner:
        assert self._runner is not None
        return self._runner

    def _finish(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        self._notifier.send("STOPPING=1")
        self.publish_metrics()  # the final figures of this run
        self.report_drops()
        if self.worker_list[1:]:
            self.send(self.topics.fixed(Family.COMMAND), Stop(run_id=self.run_id))
        self.set_status("idle")  # the run is over (workers leave a run whose central node is idle)
        self.stop_heartbeats()
        self.probes.unwatch_all()
        if self._owns_transport:
            self.set_status("left")  # and the process leaves: monitors stop listing it as a live device
            self.transport.close()

    @property
    def _resplits(self) -> bool:
        """Whether the split follows measurements (FTPipeHD). ResPipe, the baseline, never re-splits: the
        next worker takes a dead one's layers and keeps them (papers/002)."""
        return self.config.partition == "dynamic" and self.config.recovery != "respipe"

    def _bound(self) -> int:
        return self.train.in_flight or len(self.worker_list)

    def _event(self, name: str, **details: Any) -> None:
        self.send(self.topics.fixed(Family.EVENTS), Event(name=name, run_id=self.run_id, details=details))

    # -- initialization (Sec. III-B) -----------------------------------------------------------

    def _discover(self, wanted: int) -> list[str]:
        """Ask devices to announce themselves until ``wanted`` idle workers answered."""
        if wanted == 0:
            return []
        found: dict[str, Announce] = {}
        deadline = time.monotonic() + self.config.startup_timeout
        next_ask = 0.0
        log.info("waiting for %d worker(s) on %s", wanted, self.topics.base)
        while len(found) < wanted:
            now = time.monotonic()
            if now > deadline:
                raise TrainingError(
                    f"only {len(found)} of {wanted} workers announced themselves within "
                    f"{self.config.startup_timeout:.0f} s ({sorted(found)}); start more with "
                    f"`edgeagent worker --broker URL --cluster {self.topics.cluster}`"
                )
            if now >= next_ask:
                self.send(self.topics.fixed(Family.DISCOVER), Discover(run_id=self.run_id))
                next_ask = now + 2.0
            item = self.next_message(0.2)
            if item is None:
                continue
            msg = item.message
            # Idle devices, or (after the central node itself restarted) devices still in this run.
            if (
                isinstance(msg, Announce)
                and msg.busy_with in ("", self.run_id)
                and msg.device_id != self.device_id
            ):
                found.setdefault(msg.device_id, msg)
        # The worker list is ordered by device id so that a re-run gives the same pipeline.
        chosen = sorted(found)[:wanted]
        now = time.monotonic()
        self.workers = {
            d: _Worker(d, now, slowdown=found[d].slowdown, memory_limit=found[d].memory_limit) for d in chosen
        }
        log.info("workers: %s", ", ".join(chosen))
        return chosen

    def _worker_from(self, device: str) -> _Worker:
        """A device that joins or comes back: what it announced (speed, memory limit) counts again."""
        announce = self._announced.get(device)
        if announce is None:
            return _Worker(device, time.monotonic())
        return _Worker(
            device, time.monotonic(), slowdown=announce.slowdown, memory_limit=announce.memory_limit
        )

    def _profile_layers(self, spec: ModelSpec, data: Dataset) -> LayerProfile:
        model = build_model(spec, seed=self.train.seed)
        sample = data.x_train[: self.train.batch_size]
        profile = profile_layers(list(model), sample, runs=10)
        log.info(
            "profiled %d layers: %.2f ms per batch in all", len(profile.seconds), 1e3 * sum(profile.seconds)
        )
        return profile

    def _assign(
        self,
        device: str,
        *,
        committed: int = -1,
        status: int = 0,
        weights: dict[str, torch.Tensor] | None = None,
        momentum: dict[str, torch.Tensor] | None = None,
        worker_list: list[str] | None = None,
        points: list[int] | None = None,
    ) -> None:
        """Send ``device`` the Table I state and everything it needs to build its stage."""
        assert self._spec is not None
        worker_list = worker_list or self.worker_list
        points = points or self.points
        index = worker_list.index(device)
        profile = self._profile
        self.send(
            self.topics.device(Family.CONTROL, device),
            Assign(
                run_id=self.run_id,
                plan_id=self.plan_id,
                worker_list=worker_list,
                points=points,
                model=self._spec.to_dict(),
                seed=self.train.seed,
                committed_forward_id=committed,
                committed_backward_id=committed,
                status=status,
                learning_rate=self.train.learning_rate,
                epochs=self.train.epochs,
                batches_per_epoch=self._per_epoch,
                momentum=self.train.momentum,
                weight_decay=self.train.weight_decay,
                in_flight=self._bound(),
                aggregation=self.train.aggregation,
                aggregation_interval=self.train.aggregation_interval,
                weights=layer_slice(weights, points[index], points[index + 1]),
                momentum_buffers=layer_slice(momentum, points[index], points[index + 1]),
                chain_every=self.config.chain_every,
                global_every=self.config.global_every,
                replicas=self.config.replicas,
                metrics_interval=self.config.metrics_interval,
                layer_shapes=[list(shape) for shape in profile.output_shapes] if profile else [],
                layer_dtypes=list(profile.output_dtypes) if profile else [],
            ),
        )

    def _setup(self, spec: ModelSpec) -> Stage:
        initial = self._initial_weights()
        momentum = None
        if self._resume is not None:
            initial, momentum = self._resume["weights"], self._resume["momentum"]
        version = self._start_version
        for device in self.worker_list[1:]:
            self._assign(device, weights=initial, momentum=momentum, committed=version - 1)
        stage = build_stage(
            spec,
            seed=self.train.seed,
            options=self.options,
            points=self.points,
            index=0,
            weights=initial,
            momentum_buffers=momentum,
            version=version,
        )
        # A replica at the starting version: no rollback ever goes past the weights the run started from
        # (the workers send theirs before "built"; see Worker._assign).
        self.store.snapshot(stage)
        self._subscribe_stage()
        self._wait_ready(self.plan_id, "built", set(self.worker_list[1:]))
        return stage

    def _stage_topics(self) -> list[str]:
        n = len(self.worker_list)
        if n < 2:
            return []
        topics = [self.topics.gradients(1), self.topics.results(n - 1)]
        # The last ``replicas`` workers' chain replicas wrap around to the central node.
        for device in self.worker_list[max(1, n - self.config.replicas) :]:
            topics.append(self.topics.device(Family.REPLICA, device))
        return topics

    def _subscribe_stage(self) -> None:
        for topic in self._stage_topics():
            self.listen(topic)

    def _unsubscribe_stage(self) -> None:
        for topic in self._stage_topics():
            self.stop_listening(topic)

    def _initial_weights(self) -> dict[str, torch.Tensor] | None:
        """Pre-trained weights (continuous learning), renamed to the stage modules' ``layers.<j>.`` keys."""
        if not self.train.init_weights:
            return None
        state = torch.load(self.train.init_weights, map_location="cpu", weights_only=True)
        return {k if k.startswith("layers.") else f"layers.{k}": v for k, v in state.items()}

    def _wait_ready(self, plan_id: int, phase: str, devices: set[str]) -> None:
        deadline = time.monotonic() + self.config.startup_timeout
        while True:
            done = {d for d, p in self._ready.get(plan_id, {}).items() if p == phase}
            pending = devices - done
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TrainingError(
                    f"workers {sorted(pending)} did not report {phase!r} for plan {plan_id} within "
                    f"{self.config.startup_timeout:.0f} s"
                )
            dead = sorted(d for d in pending if d in self.workers and not self.workers[d].online)
            if dead and self._train_started:
                raise _Fault(dead, f"worker(s) {dead} stopped while the pipeline was switching")
            item = self.next_message(0.2)
            if item is not None:
                if isinstance(item.message, ErrorReport) and item.message.run_id == self.run_id:
                    raise TrainingError(f"worker {item.message.device_id} failed: {item.message.reason}")
                self._handle_background(item)

    def _measure_links(self) -> list[Link]:
        """Bandwidth and latency of every link k -> k+1 along the real path (through the broker)."""
        n = len(self.worker_list)
        if n < 2:
            return []
        for k in range(1, n - 1):
            self.send(
                self.topics.fixed(Family.COMMAND),
                MeasureLink(run_id=self.run_id, source=self.worker_list[k], target=self.worker_list[k + 1]),
            )
        bandwidth, latency = self.probes.measure(self.worker_list[1])
        links = {self.device_id: Link(bandwidth, latency)}
        deadline = time.monotonic() + self.config.startup_timeout
        while len(links) < n - 1:
            for source, rep in list(self._links.items()):
                links[source] = Link(rep.bandwidth, rep.latency)
            if len(links) >= n - 1:
                break
            if time.monotonic() > deadline:
                raise TrainingError(
                    f"link measurements missing from {sorted(set(self.worker_list[:-1]) - set(links))}"
                )
            item = self.next_message(0.2)
            if item is not None:
                self._handle_background(item)
        result = [links[d] for d in self.worker_list[:-1]]
        for k, lk in enumerate(result):
            log.info(
                "link %d->%d: %.1f MB/s, %.2f ms per message", k, k + 1, lk.bandwidth / 1e6, lk.latency * 1e3
            )
        return result

    # -- planning (Sec. III-D) -----------------------------------------------------------------

    def _problem(
        self, caps: list[float], workers: list[str] | None = None, links: list[Link] | None = None
    ) -> Problem:
        profile = self._profile
        assert profile is not None and self._spec is not None
        params = self._param_bytes()
        devices = workers or self.worker_list
        limits = self._memory_limits(devices)
        return Problem(
            memory_limits=limits,
            layer_times=tuple(profile.seconds),
            output_bytes=tuple(profile.output_bytes),
            capacities=tuple(caps),
            links=tuple(self.links if links is None else links),
            param_bytes=params,
            in_flight=self.train.in_flight or len(devices),
            activation_factor=self._comm_factor(len(devices)),
        )

    def _comm_factor(self, n: int) -> float:
        """Compressed / raw bytes on the links (AccEPT eq. 9-10: the DP sees compressed sizes).

        Each link carries activations one way and gradients the other: the mean of the two ratios.
        """
        if self._bits is None or n < 2 or len(self._bits[0]) != n:
            return 1.0
        forward, backward = self._bits
        shares = [(min(forward[k], NONE) + min(backward[k + 1], NONE)) / (2 * NONE) for k in range(n - 1)]
        return sum(shares) / len(shares)

    def _param_bytes(self) -> tuple[int, ...]:
        assert self._spec is not None
        if self._params is None:
            model = build_model(self._spec, seed=self.train.seed)
            self._params = tuple(
                sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in model
            )
        return self._params

    def _memory_limits(self, devices: list[str]) -> tuple[float | None, ...] | None:
        """Per stage: the memory limit its device announced (bytes), None for none; None if nobody has one."""
        limits = [None, *(self._limit_of(d) or None for d in devices[1:])]
        return tuple(limits) if any(limits) else None

    def _limit_of(self, device: str) -> float:
        """A worker's memory limit in bytes (0: none); a joiner's from its announcement."""
        w = self.workers.get(device)
        if w is not None:
            return w.memory_limit
        announce = self._announced.get(device)
        return announce.memory_limit if announce is not None else 0.0

    def _solve(self, problem: Problem) -> list[int]:
        """The DP's split, or a :class:`PlanningError` that says what to change when none fits."""
        try:
            return solve(problem)
        except ValueError as exc:
            raise PlanningError(
                f"{exc}; give the devices more memory (--memory-limit-mb, device profiles), add devices, "
                "or lower --in-flight / the batch size"
            ) from None

    def _initial_points(self, profile: LayerProfile) -> list[int]:
        """The initial split (and ``--partition uniform``'s only one): PipeDream's equal-device split
        (papers/000 Sec. III-B); with memory limits, the same objective (equal devices, links free)
        solved by the DP under those limits, so a memory-tight device never gets more than it holds."""
        n = len(self.worker_list)
        if self._memory_limits(self.worker_list) is None:
            return balanced_partition(profile.seconds, n)
        equal = self._problem([1.0] * n, links=[Link(math.inf)] * (n - 1))
        return self._solve(equal)

    def _true_capacities(self) -> list[float]:
        return [self.config.slowdown, *(self.workers[d].slowdown for d in self.worker_list[1:])]

    def _measured_capacities(self) -> list[float] | None:
        profile = self._profile
        own = self._runner.recent if self._runner is not None else ()
        if profile is None or len(self._stage_times) != len(self.worker_list) - 1 or not own:
            return None
        times = [sum(own) / len(own), *self._stage_times]
        return capacities(times, profile.seconds, self.points)

    def _plan(self, caps: list[float], current: list[int], workers: list[str]) -> Plan:
        """The planning job (runs on the scheduler's thread): planner.policy.choose_plan."""
        problem = self._problem(caps, workers=workers, links=self._links_for(workers))
        try:
            choice = choose_plan(
                problem,
                current,
                joiners=workers[len(self.worker_list) :],
                horizon_batches=self.policy.every,
                move_bandwidth=min((lk.bandwidth for lk in self.links), default=1e9),
            )
        except ValueError as exc:
            raise PlanningError(f"{exc}; the split stays as it is") from None
        return Plan(choice.points, choice.predicted, choice.reason, workers)

    def _start_planning(self) -> None:
        caps = self._measured_capacities()
        if caps is None or self._plan_job is not None or self._scheduler is None:
            return
        joiners = [d for d in self._joiners if d not in self.worker_list]
        workers = [*self.worker_list, *joiners]
        # A newcomer's speed is unknown until it has run: take the mean of the workers' capacities.
        known = caps[1:] or caps
        caps = [*caps, *[sum(known) / len(known)] * len(joiners)]
        job: Future[Plan] = Future()
        current = list(self.points)

        def run() -> None:
            try:
                job.set_result(self._plan(caps, current, workers))
            except Exception as exc:  # a planning bug must not stop training: keep the split
                job.set_exception(exc)

        self._scheduler.add_job(run, id=f"plan-{self.plan_id}", replace_existing=True)
        self._plan_job = job

    def _admit_joiners(self, plan: Plan, version: int) -> None:
        """Give joining devices the run's state for the new split; they fetch their layers in the switch."""
        joiners = [d for d in plan.workers if d not in self.worker_list]
        for device in joiners:
            self._ready.get(self.plan_id, {}).pop(device, None)
            self._assign(device, committed=version - 1, worker_list=plan.workers, points=plan.points)
            self.workers[device] = self._worker_from(device)
        self._wait_ready(self.plan_id, "built", set(joiners))
        for device in joiners:
            self._joiners.remove(device)
            log.info("%s joined the run at batch %d", device, version)
            self._event("join", device=device, batch=version)

    def _switch_to(
        self,
        points: list[int],
        *,
        version: int,
        workers: list[str] | None = None,
        sources: list[str] | None = None,
        recovery: bool = False,
        reason: str = "",
    ) -> None:
        """Move layers to a new split: fetch, commit, build (the pipeline is drained or stopped).

        For a recovery every stage rolls back to ``version`` and ``sources`` says who serves each old
        stage's weights; ``workers`` is the new worker list (survivors, in their old order).
        """
        assert self._spec is not None
        new_list = workers or self.worker_list
        # Plan ids are never reused: a switch that a fault interrupted must not lend its replies to the next.
        self._plan_counter = max(self._plan_counter, self.plan_id) + 1
        order = Repartition(
            run_id=self.run_id,
            plan_id=self._plan_counter,
            points=points,
            worker_list=new_list,
            previous_points=self.points,
            previous_workers=self.worker_list,
            version=version,
            reason=reason,
            recovery=recovery,
            sources=sources or [],
        )
        for device in new_list[1:]:
            self.send(self.topics.device(Family.CONTROL, device), order)
        live = self._runner.stage if self._runner is not None else None
        switch = Switch.start(self.device_id, order, self.store, live, self._spec, self.train.seed)
        assert switch is not None
        self._switch = switch
        for holder in switch.holders:
            self.listen(self.topics.device(Family.REPLICA, holder))
        for request in switch.requests():
            self.send(self.topics.device(Family.REQUEST, self.device_id), request)
        deadline = time.monotonic() + self.config.startup_timeout
        while not switch.complete:
            if time.monotonic() > deadline:
                raise TrainingError(f"layers {switch.pending} never arrived for plan {order.plan_id}")
            gone = sorted(h for h in switch.holders if h in self.workers and not self.workers[h].online)
            if gone:
                raise _Fault(gone, f"{gone} stopped while serving layers for plan {order.plan_id}")
            item = self.next_message(0.2)
            if item is not None:
                self._handle_background(item)
        self._wait_ready(order.plan_id, "fetched", set(new_list[1:]))
        self.send(self.topics.fixed(Family.COMMIT), Commit(run_id=self.run_id, plan_id=order.plan_id))
        built = switch.build(self._spec, self.train.seed, self.options)
        self._runner = StageRunner(built, 0, codecs=self.codecs)
        for holder in switch.plan.fetch:
            self.stop_listening(self.topics.device(Family.REPLICA, holder))
        self._switch = None
        self._unsubscribe_stage()
        self.plan_id, self.points, self.worker_list = order.plan_id, list(points), list(new_list)
        self._subscribe_stage()
        # Snapshots of the old layout cannot restore the new one: start afresh at this version. The
        # workers' global replicas of it arrive before their "built" (same topic).
        self.store.clear()
        self.store.snapshot(self.stage)
        self._wait_ready(order.plan_id, "built", set(new_list[1:]))
        self._stage_times = []
        self._bits = None  # a new split: tell every stage its codecs again
        self._apply_compression(epoch=version // max(1, self._per_epoch))
        self._refresh_deadline()
        self._event("partition", points=points, batch=version, plan_id=self.plan_id, workers=new_list)

    def _record_partition(
        self, report: RunReport, batch: int, reason: str, predicted: float | None = None
    ) -> None:
        entry: dict[str, Any] = {
            "batch": batch,
            "points": list(self.points),
            "plan_id": self.plan_id,
            "reason": reason,
        }
        if predicted is not None:
            entry["predicted_step"] = predicted
        report.partitions.append(entry)
        log.info("partition %s from batch %d (%s)", self.points, batch, reason)

    # -- training (Sec. III-C) -----------------------------------------------------------------

    def _train(self, data: Dataset, report: RunReport) -> None:
        n_train = data.x_train.shape[0]
        per_epoch = batches_per_epoch(n_train, self.train.batch_size)
        total = per_epoch * self.train.epochs
        if self.train.max_batches:
            total = min(total, self.train.max_batches)
        train_started = time.perf_counter()
        self.times.reset()
        next_f = self._start_version  # next global batch id to forward
        committed_b = next_f - 1  # committed backward id (Table I)
        losses: list[float] = []
        epoch_orders: dict[int, list[torch.Tensor]] = {}
        pending: Plan | None = None
        window_start, window_batches = time.perf_counter(), 0
        changes = list(self.changes)

        # The committed id whose epoch-end evaluation is due: an evaluation a fault interrupted is due
        # again after the recovery, also when the rollback replays no batch of that epoch.
        def evaluation_missing(committed: int) -> bool:
            at_end = (committed + 1) % per_epoch == 0 or committed + 1 == total
            return committed >= 0 and at_end and len(report.test_accuracy_per_epoch) <= committed // per_epoch

        # (A run resumed from a checkpoint written before its epoch's evaluation was over evaluates first.)
        eval_due: int | None = committed_b if evaluation_missing(committed_b) else None

        def batch(global_id: int) -> tuple[torch.Tensor, torch.Tensor]:
            epoch, i = divmod(global_id, per_epoch)
            if epoch not in epoch_orders:
                epoch_orders.clear()
                epoch_orders[epoch] = batch_indices(
                    n_train, self.train.batch_size, epoch=epoch, seed=self.train.seed
                )
            idx = epoch_orders[epoch][i]
            return data.x_train[idx], data.y_train[idx]

        self._eval_seconds = 0.0
        self._train_started = train_started
        self._refresh_deadline()
        while True:
            try:
                while committed_b + 1 < total or eval_due is not None:
                    if eval_due is not None:
                        eval_started = time.perf_counter()
                        try:
                            self._end_epoch(eval_due, per_epoch, losses, data, report)
                        finally:
                            self._eval_seconds += time.perf_counter() - eval_started
                        eval_due = None
                        continue
                    stage = self.stage
                    epoch_end = min(total, (committed_b + 1) // per_epoch * per_epoch + per_epoch)
                    in_flight = next_f - committed_b - 1
                    if pending is not None and in_flight == 0:
                        self._admit_joiners(pending, committed_b + 1)
                        self._switch_to(
                            pending.points,
                            version=committed_b + 1,
                            workers=pending.workers,
                            reason=pending.reason,
                        )
                        pending = None
                        window_start, window_batches = time.perf_counter(), 0
                        continue
                    if self._plan_job is not None and self._plan_job.done():
                        job, self._plan_job = self._plan_job, None
                        try:
                            plan = job.result()
                        except (EdgeAgentError, ValueError) as exc:
                            log.warning("re-partition skipped: %s", exc)
                        else:
                            measured = (time.perf_counter() - window_start) / max(1, window_batches)
                            log.info(
                                "plan check at batch %d: %.1f ms/batch measured, %.1f predicted for %s (%s)",
                                committed_b + 1,
                                1e3 * measured,
                                1e3 * plan.predicted,
                                plan.points,
                                plan.reason,
                            )
                            if plan.points != self.points or plan.workers != self.worker_list:
                                pending = plan
                                report.partitions.append(
                                    {
                                        "batch": committed_b + 1,
                                        "points": plan.points,
                                        "workers": plan.workers[1:],
                                        "plan_id": self.plan_id + 1,
                                        "reason": plan.reason,
                                        "predicted_step": plan.predicted,
                                        "measured_step_before": measured,
                                    }
                                )
                    grad = self._gradients.pop(committed_b + 1, None)
                    if grad is not None or (stage.is_last and in_flight > 0):
                        # Backward of the oldest batch in flight.
                        bid = committed_b + 1
                        started = Clock()
                        if stage.is_last:
                            x, y = batch(bid)
                            result = stage.backward(bid, labels=y)
                            loss, correct = result.loss, result.correct
                        else:
                            assert grad is not None
                            stage.backward(bid, grad_output=grad.g)
                            loss, correct = grad.loss, grad.correct
                            self._stage_times = list(grad.stage_times)
                            self._refresh_deadline()
                        self.runner.add_compute(emulate_slowdown(started, self.config.slowdown, self.times))
                        self.runner.batch_done()
                        committed_b = bid
                        self._sent_at.pop(bid, None)
                        self.runner.gradient_arrived(bid)
                        losses.append(loss)
                        window_batches += 1
                        elapsed = self._last_progress = self._clock()
                        report.timeline.append({"batch": bid, "t": round(elapsed, 4), "loss": loss})
                        done = bid + 1
                        if any(
                            every and done % every == 0
                            for every in (self.config.chain_every, self.config.global_every)
                        ):
                            self.store.snapshot(stage)  # stage 0's own weights at this replication point
                        self._notify(batch=bid + 1, total=total, loss=loss, correct=correct)
                        while changes and changes[0][1] <= bid + 1:
                            device, at, factor = changes.pop(0)
                            self._emulate(device, factor, at)
                        if self._resplits and self.policy.due(bid + 1) and bid + 1 < total:
                            self._start_planning()
                        if committed_b + 1 == epoch_end:
                            eval_due = committed_b
                        continue
                    if next_f < epoch_end and pending is None and admit(in_flight, self._bound()):
                        started = Clock()
                        x, y = batch(next_f)
                        out, version = stage.forward(next_f, x)
                        # Forward of this batch; its backward comes after other batches' forwards: the
                        # window pairs each backward with the latest forward, which averages the same.
                        self.runner.step_seconds = emulate_slowdown(started, self.config.slowdown, self.times)
                        if not stage.is_last:
                            activation = self.runner.activation(
                                out,
                                y,
                                run_id=self.run_id,
                                plan_id=self.plan_id,
                                batch_id=next_f,
                                version=version,
                                mode="train",
                                epoch=next_f // per_epoch,
                            )
                            self.codecs.message_sent(self.send(self.topics.activations(0), activation))
                            self._sent_at[next_f] = time.monotonic()
                        next_f += 1
                        continue
                    self._wait_for_messages(next_batch=committed_b + 1)
                break
            except _Fault as fault:
                committed_b = self._recover_until_done(fault, committed_b, report)
                next_f = committed_b + 1
                pending = None
                self._plan_job = None
                eval_due = committed_b if evaluation_missing(committed_b) else None
                window_start, window_batches = time.perf_counter(), 0

        report.train_seconds = self._clock()
        t = self.times.summary()
        log.info(
            "central: of %.1f s: compute %.1f, communication %.1f, idle %.1f",
            t["wall"],
            t["compute"],
            t["communication"],
            t["idle"],
        )
        report.batches = committed_b + 1
        report.compression = self.config.compression
        report.compression_ratio = self.codecs.ratio
        report.compression_ratio_tensors = self.codecs.tensor_ratio
        report.epochs = len(report.test_accuracy_per_epoch)
        # Each batch of the run counts once: batches replayed after a rollback are time lost, not work.
        samples = (report.batches - self._start_version) * self.train.batch_size
        report.samples_per_second = samples / report.train_seconds if report.train_seconds else 0.0
        if report.test_accuracy_per_epoch:
            report.final_accuracy = report.test_accuracy_per_epoch[-1]
        elif total:
            report.final_accuracy, _ = self._evaluate(data)

    def _metrics(self) -> dict[str, Any] | None:
        """What the central node publishes on its metrics topic (docs/protocol.md)."""
        report = self._report
        if report is None or not self._train_started:
            return None
        t = self.times.summary()
        last = report.timeline[-1] if report.timeline else None
        done = len(report.timeline)
        return {
            "stage": 0,
            "batches": done,
            "samples_per_second": done * self.train.batch_size / max(1e-9, self._clock()),
            "compute_s": round(t["compute"], 3),
            "communication_s": round(t["communication"], 3),
            "idle_s": round(t["idle"], 3),
            "wall_s": round(t["wall"], 3),
            "loss": last["loss"] if last else None,
            "accuracy": report.test_accuracy_per_epoch[-1] if report.test_accuracy_per_epoch else None,
            "points": list(self.points),
            "workers": list(self.worker_list[1:]),
            "status": self.status,
            "compression_ratio": round(self.codecs.ratio, 3),
            "slowdown": self.config.slowdown,
            "link_mbps": self.config.link_mbps,
        }

    def _announce_to_home_assistant(self) -> None:
        from edgeagent.ops.homeassistant import discovery_configs

        for device in self.worker_list:
            for topic, payload in discovery_configs(
                self.topics, device, prefix=self.config.home_assistant_prefix
            ).items():
                self.transport.publish(topic, payload, retain=True)
        log.info("Home Assistant discovery published for %s", ", ".join(self.worker_list))

    def _clock(self) -> float:
        """Training seconds so far (evaluation excluded): the time axis of the report."""
        return time.perf_counter() - self._train_started - self._eval_seconds

    def _end_epoch(
        self, committed_b: int, per_epoch: int, losses: list[float], data: Dataset, report: RunReport
    ) -> None:
        epoch = committed_b // per_epoch
        acc, test_loss = self._evaluate(data)
        tail = losses[-per_epoch:]
        # An epoch replayed after a recovery overwrites its earlier figures.
        del report.test_accuracy_per_epoch[epoch:], report.test_loss_per_epoch[epoch:]
        del report.train_loss_per_epoch[epoch:]
        report.test_accuracy_per_epoch.append(acc)
        report.test_loss_per_epoch.append(test_loss)
        report.train_loss_per_epoch.append(sum(tail) / max(1, len(tail)))
        log.info("epoch %d: test accuracy %.2f%%, test loss %.4f", epoch, 100 * acc, test_loss)
        self._notifier.status(f"run {self.run_id}: epoch {epoch} test accuracy {100 * acc:.1f}%")
        if self.codecs.sent_bytes:
            log.info(
                "stage 0 sent %.1f MB for %.1f MB of tensors (ratio %.1f; %.1f with the messages' envelopes)",
                self.codecs.sent_bytes / 1e6,
                self.codecs.raw_bytes / 1e6,
                self.codecs.tensor_ratio,
                self.codecs.ratio,
            )
        self._apply_compression(epoch=epoch + 1)
        self._event("epoch", epoch=epoch, accuracy=acc, loss=test_loss, batch=committed_b)
        self._notify(epoch=epoch, accuracy=acc)

    def _compression_bits(self, epoch: int) -> tuple[list[int], list[int]]:
        """Bit widths per stage (compression.stage_bits) from the mode, the epoch and the links."""
        n = len(self.worker_list)
        links: list[tuple[float, int]] = []
        step = 0.0
        if self.config.compression == "auto" and n > 1:
            assert self._profile is not None
            problem = self._problem(self._measured_capacities() or [1.0] * n)
            # The compute a transfer can hide behind: the slowest stage's (not the predicted step, which
            # already contains the slow link itself).
            step = max(compute_time(problem, k, self.points[k], self.points[k + 1]) for k in range(n))
            sizes = [self._profile.output_bytes[self.points[k + 1] - 1] for k in range(n - 1)]
            links = [(lk.bandwidth, size) for lk, size in zip(self.links, sizes, strict=False)]
        mode, epochs = self.config.compression, self.train.epochs
        return stage_bits(mode, n, epoch=epoch, epochs=epochs, links=links, compute_seconds=step)

    def _apply_compression(self, epoch: int) -> None:
        """Tell every stage its codecs when they change (start, epoch, new split, new links)."""
        bits = self._compression_bits(epoch)
        if bits == self._bits:
            return
        self._bits = bits
        forward, backward = bits
        self.codecs.set_bits(forward[0], backward[0])
        if len(self.worker_list) > 1:
            self.send(
                self.topics.fixed(Family.COMMAND),
                SetCompression(run_id=self.run_id, plan_id=self.plan_id, forward=forward, backward=backward),
            )
        log.info(
            "compression %s: forward bits %s, backward bits %s", self.config.compression, forward, backward
        )
        self._event("compression", forward=forward, backward=backward, epoch=epoch)

    def _emulate(self, device: str, factor: float, batch: int) -> None:
        log.info("batch %d: %s now emulates a %.1fx slower device", batch, device, factor)
        if device == self.device_id:
            self.config = self.config.model_copy(update={"slowdown": factor})
        else:
            self.send(
                self.topics.fixed(Family.COMMAND),
                Emulate(run_id=self.run_id, device=device, slowdown=factor),
            )
        self._event("slowdown", device=device, slowdown=factor, batch=batch)

    def _wait_for_messages(self, *, next_batch: int | None = None) -> None:
        """Block for the next message; meanwhile check that the pipeline is alive.

        Everything queued is handled before the check, and if the gradients of ``next_batch`` (the oldest
        batch in flight) are in, the check waits for the next round: work that arrived before a fault
        (the gradients a worker sent just before it died; its last will is stamped on arrival, on the
        network thread, while they may still wait in the inbox) is done first, so the fault is recorded
        at the first batch whose gradients really are missing (Sec. III-F).
        """
        item = self.next_message(0.5)
        while item is not None:
            self._handle_background(item)
            item = self.next_message(0)
        if next_batch is not None and next_batch in self._gradients:
            return
        self._check_liveness()

    def _check_liveness(self) -> None:
        """Detect faults (Sec. III-F): a batch whose gradients are late, missed heartbeats, a last will."""
        now = time.monotonic()
        if not self.transport.connected:
            # Our own link to the broker is down: nobody can be judged by heartbeats meanwhile.
            self._grace_until = now + 3 * self.config.heartbeat_interval
            return
        if now < self._grace_until:
            for w in self.workers.values():
                w.last_heartbeat = max(w.last_heartbeat, now - self.config.heartbeat_interval)
        limit = 3 * self.config.heartbeat_interval + self._transfer_slack()
        for w in self.workers.values():
            if w.online and now - w.last_heartbeat > limit:
                w.online = False
                log.warning("worker %s missed heartbeats for %.1f s", w.device_id, now - w.last_heartbeat)
        dead = [
            w.device_id for w in self.workers.values() if not w.online and w.device_id in self.worker_list
        ]
        late = [bid for bid, sent in self._sent_at.items() if now - sent > self._batch_deadline][:1]
        if dead or late:
            reason = (
                f"worker(s) {dead} stopped"
                if dead
                else f"gradients of batch {late[0]} are late (timer {self._batch_deadline:.1f} s)"
            )
            raise _Fault(dead, reason)

    # -- deadlines derived from measurements (planner/deadlines.py) ----------------------------

    def _capacity_estimates(self) -> list[float]:
        """Every stage's capacity: measured where it ran (the latest window), else assumed slow.

        A device that has not run a batch yet may be a Pi: it is taken as ``unmeasured_slowdown`` times
        slower than the central node (times its announced emulated slowdown): the first batch's timer is
        generous, and from the first gradients on the measured times count.
        """
        measured = self._measured_capacities()
        if measured is not None:
            self._known_caps.update(zip(self.worker_list, measured, strict=True))
        caps = []
        for device in self.worker_list:
            known = self._known_caps.get(device)
            if known is None and device == self.device_id:
                known = self.config.slowdown
            elif known is None:
                w = self.workers.get(device)
                known = (w.slowdown if w else 1.0) * self.config.unmeasured_slowdown
            caps.append(known)
        return caps

    def _predicted_step(self) -> tuple[float, float]:
        """(seconds per batch of the current split, seconds of its slowest stage's compute)."""
        profile = self._profile
        if profile is None or self._spec is None:
            return 0.0, 0.0
        caps = self._capacity_estimates()
        n = len(caps)
        # Before the links are measured (set-up), only compute counts.
        links = self.links if len(self.links) == n - 1 else [Link(math.inf)] * (n - 1)
        problem = self._problem(caps, links=links)
        slowest = max(compute_time(problem, k, self.points[k], self.points[k + 1]) for k in range(n))
        return predict(problem, self.points), slowest

    def _refresh_deadline(self) -> None:
        """The batch timer of Sec. III-F from the measured step (after every gradient, split and fault)."""
        step, _ = self._predicted_step()
        self._batch_deadline = self.deadlines.batch(step, stages=len(self.worker_list), bound=self._bound())

    def _eval_deadline(self) -> float:
        step, _ = self._predicted_step()
        return self.deadlines.evaluation(
            step,
            stages=len(self.worker_list),
            bound=self._eval_bound(),
            eval_batch=self.train.eval_batch_size,
            train_batch=self.train.batch_size,
        )

    def _probe_window(self) -> float:
        """How long live devices may take to answer the probe: their slowest step and a round trip."""
        _, slowest = self._predicted_step()
        round_trip = 2 * max((lk.latency for lk in self.links), default=0.0) + self._transfer_slack()
        return self.deadlines.probe(slowest, round_trip)

    def _transfer_slack(self) -> float:
        """How long a worker's uplink may be busy before its next message (a heartbeat included) gets
        through on the slowest measured link: every batch in flight's activation, and the chain and
        global replicas of the largest stage (weights and momentum), queued ahead of it."""
        if not self.links or self._profile is None or self._spec is None:
            return 0.0
        slowest = min(lk.bandwidth for lk in self.links)
        # output_bytes were profiled on one training batch: the size of a real activation message.
        activations = self._bound() * max(self._profile.output_bytes)
        params = self._param_bytes()
        stages = range(len(self.points) - 1)
        replicas = 2 * 2 * max((sum(params[self.points[k] : self.points[k + 1]]) for k in stages), default=0)
        return 2 * (activations + replicas) / slowest

    # -- fault tolerance (Sec. III-F) ----------------------------------------------------------

    def _recover_until_done(self, fault: _Fault, committed_b: int, report: RunReport) -> int:
        """Recover; a device that dies during the recovery starts another one (at most 5 in a row)."""
        for _ in range(5):
            try:
                return self._recover(fault, committed_b, report)
            except _Fault as again:
                log.warning("another fault during the recovery: %s", again.reason)
                fault = again
        raise TrainingError(f"gave up after 5 faults in a row; the last: {fault.reason}")

    def _recover(self, fault: _Fault, committed_b: int, report: RunReport) -> int:
        """Probe, pick survivors and a recovery point, re-split, roll back; return the new committed id."""
        assert self._profile is not None
        detected = self._clock()
        self.status = 1  # set once: later timers of the same fault do not start another recovery
        fault_batch = committed_b + 1
        log.warning("fault at batch %d: %s; probing the workers", fault_batch, fault.reason)
        self._event("fault", batch=fault_batch, reason=fault.reason, devices=fault.dead)
        self._alive.clear()
        self._announced.clear()
        self.send(self.topics.fixed(Family.COMMAND), Ping(run_id=self.run_id))
        self.send(self.topics.fixed(Family.DISCOVER), Discover(run_id=self.run_id))
        # Wait for every device of the run: in-run devices answer the ping within the probe window (their
        # slowest step and a round trip); one that restarted with its id (case 2) announces itself idle,
        # which on a Pi takes a systemd restart and Python's start-up: a device that is really gone costs
        # the whole restart window (``--restart-window``; 0 recovers at once without it).
        # A device known to be down (last will, missed heartbeats) cannot answer before it restarts: it
        # gets the restart window; the others the probe window.
        expected = set(self.worker_list[1:])
        down = {d for d in expected if (w := self.workers.get(d)) is not None and not w.online}
        started = time.monotonic()
        probe = self._probe_window()
        until = {d: started + (self.config.restart_window if d in down else probe) for d in expected}
        log.info(
            "waiting up to %.1f s for %s to answer or come back",
            max(until.values(), default=started) - started,
            sorted(expected),
        )
        while True:
            pending = expected - set(self._alive) - set(self._announced)
            now = time.monotonic()
            if not any(now < until[d] for d in pending):
                break
            item = self.next_message(0.05)
            if item is not None:
                self._handle_background(item)
        alive = set(self._alive)
        idle = [d for d, a in self._announced.items() if not a.busy_with]
        outcome = classify_probe(self.worker_list[1:], alive, idle)
        case, restarted, missing = outcome.case, set(outcome.restarted), set(outcome.missing)
        holdings: dict[str, dict[str, list[int]]] = {d: r.holdings for d, r in self._alive.items()}
        holdings[self.device_id] = self.store.holdings()
        # Version 0 rebuilt from the seed is the run's start only for a fresh run without pre-trained
        # weights; otherwise the start is a replica like any other (taken when the run started).
        seeded = self._start_version == 0 and not self.train.init_weights
        point = choose_recovery_point(
            self.worker_list,
            alive | {self.device_id},
            holdings,
            replicas=self.config.replicas,
            seeded=seeded,
            start=self._start_version,
        )
        new_list = new_worker_list(self.worker_list, alive | restarted | {self.device_id})
        points = list(self.points)
        if case == 3 and self.config.recovery == "respipe":
            points, new_list = respipe_points(self.points, self.worker_list, missing)
        elif case == 3:
            points = self._survivor_split(new_list)
        for device in restarted:
            # Case 2: it came back with its id. Send it the Table I state (status 1); it builds a fresh
            # stage, then fetches its replica in the switch below.
            self._ready.get(self.plan_id, {}).pop(device, None)
            self._assign(device, committed=point.version - 1, status=1)
            self.workers[device] = self._worker_from(device)
        self._wait_ready(self.plan_id, "built", restarted)
        reason = (
            f"recovery case {case}: lost {sorted(missing)}, restarted {sorted(restarted)}; "
            f"rolled back to version {point.version}"
        )
        new_links = self._links_for(new_list)
        self._switch_to(
            points,
            version=point.version,
            workers=new_list,
            sources=list(point.sources),
            recovery=True,
            reason=reason,
        )
        self.links = new_links
        for device in missing:
            self.workers.pop(device, None)
        self._gradients.clear()
        self._sent_at.clear()
        self.runner.outputs.clear()
        self._results.clear()
        self._refresh_deadline()
        self.status = 0
        resumed = self._clock()
        record = {
            "case": case,
            "devices": sorted(missing | restarted | set(fault.dead)),
            "lost": sorted(missing),
            "restarted": sorted(restarted),
            "batch": fault_batch,
            "last_progress_at": round(self._last_progress, 4),
            "detected_at": round(detected, 4),
            "resumed_at": round(resumed, 4),
            "rolled_back_to": point.version,
            "batches_replayed": fault_batch - point.version,
            # Which weight versions each live device could serve (its own and the replicas it held).
            "holdings": holdings,
            "points": points,
            "workers": new_list[1:],
            "recovery": self.config.recovery,
        }
        report.recoveries.append(record)
        report.partitions.append(
            {"batch": point.version, "points": points, "plan_id": self.plan_id, "reason": reason}
        )
        log.warning(
            "recovered (case %d) in %.2f s after detection: stages %s on %s, replaying from batch %d",
            case,
            resumed - detected,
            points,
            new_list,
            point.version,
        )
        self._event("recovery", **record)
        return point.version - 1

    def _survivor_split(self, new_list: list[str]) -> list[int]:
        """The DP over the survivors (measured capacities where known, else equal devices)."""
        assert self._profile is not None
        caps = self._measured_capacities()
        by_device = dict(zip(self.worker_list, caps, strict=True)) if caps else {}
        survivor_caps = [by_device.get(d, 1.0) for d in new_list]
        problem = self._problem(survivor_caps, workers=new_list, links=self._links_for(new_list))
        return self._solve(problem)

    def _links_for(self, new_list: list[str]) -> list[Link]:
        """Links of a new worker list: measured ones where neighbours stay neighbours; for new pairs the
        slowest measured link (no probe, to keep a recovery short)."""
        old_links = dict(zip(itertools.pairwise(self.worker_list), self.links, strict=False))
        slowest = min(self.links, key=lambda lk: lk.bandwidth) if self.links else Link(1e9)
        return [old_links.get(pair, slowest) for pair in itertools.pairwise(new_list)]

    def _replicated(self, msg: Weights) -> None:
        """Tell monitors when a replication round is complete (all global replicas, or the last chain one)."""
        held = self.store.holdings()
        if msg.purpose == "global" and all(msg.version in held.get(d, []) for d in self.worker_list[1:]):
            self._event("replication", kind="global", version=msg.version, devices=self.worker_list[1:])
        elif msg.purpose == "chain" and msg.device_id == self.worker_list[-1]:
            self._event("replication", kind="chain", version=msg.version, device=msg.device_id)

    def _maybe_checkpoint(self, version: int) -> None:
        """At a global replication point, once every stage's replica of it is in, write a checkpoint."""
        path = self.config.checkpoint
        if (
            not path
            or self._spec is None
            or not self.config.global_every
            or version % self.config.global_every
        ):
            return
        held = self.store.holdings()
        if not all(version in held.get(d, []) for d in self.worker_list):
            return
        weights: dict[str, torch.Tensor] = {}
        momentum: dict[str, torch.Tensor] = {}
        for device in self.worker_list:
            snap = self.store.snapshots[device][version]
            weights.update(snap.weights)
            momentum.update(snap.momentum)
        state = {
            "format": 1,
            "run_id": self.run_id,
            "version": version,
            "points": list(self.points),
            "worker_list": list(self.worker_list),
            "weights": weights,
            "momentum": momentum,
            "config": self.config.model_dump_json(),
            "plan_id": self.plan_id,
            "history": {
                key: list(getattr(self._report, key)) if self._report else []
                for key in ("test_accuracy_per_epoch", "test_loss_per_epoch", "train_loss_per_epoch")
            },
        }
        tmp = f"{path}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic: a crash leaves the previous checkpoint whole
        log.info("checkpoint of version %d written to %s", version, path)

    def _handle_background(self, item: Inbound) -> None:
        msg = item.message
        if isinstance(msg, Gradient):
            if msg.run_id == self.run_id and msg.plan_id == self.plan_id:
                grad, problem = self.runner.take_gradient(msg)
                if grad is None:
                    self.discard(item, problem or "")
                    return
                self._gradients[grad.batch_id] = grad
        elif isinstance(msg, EvalResult):
            if msg.run_id == self.run_id and msg.plan_id == self.plan_id:
                if msg.batch_id not in self._eval_ids:
                    if self._eval_ids:  # else a late duplicate of an evaluation that is over
                        self.discard(item, f"no evaluation batch {msg.batch_id} is out")
                    return
                self._results[msg.batch_id] = msg
        elif isinstance(msg, Status):
            w = self.workers.get(msg.device_id)
            if w is not None and msg.state == "offline" and not w.online:
                log.warning("worker %s went offline (last will)", msg.device_id)
        elif isinstance(msg, Ready):
            if msg.run_id == self.run_id:
                if msg.phase == "alive":
                    self._alive[msg.device_id] = msg
                else:
                    self._ready.setdefault(msg.plan_id, {})[msg.device_id] = msg.phase
        elif isinstance(msg, LinkReport):
            if msg.run_id == self.run_id:
                self._links[msg.source] = msg
        elif isinstance(msg, FetchRequest):
            if msg.run_id == self.run_id and msg.owner == self.device_id and self._spec is not None:
                try:
                    reply = serve_fetch(
                        self.store, self.runner.stage, msg, self._spec, self.train.seed, self.run_id
                    )
                except TrainingError as exc:
                    log.error("cannot serve %s's fetch of layers %s: %s", msg.requester, msg.layers, exc)
                    return
                self.send(self.topics.device(Family.REPLICA, self.device_id), reply)
        elif isinstance(msg, Weights):
            if msg.run_id != self.run_id:
                return
            if msg.purpose == "redistribute":
                if self._switch is not None:
                    self._switch.accept(msg)
            elif msg.purpose in ("chain", "global") and msg.plan_id == self.plan_id:
                try:
                    self.store.add_replica(msg)
                except TrainingError as exc:
                    log.warning("%s", exc)
                    return
                self._replicated(msg)
                self._maybe_checkpoint(msg.version)
            else:
                self._weights[msg.device_id] = msg
        elif isinstance(msg, Announce):
            self._announced.pop(msg.device_id, None)
            self._announced[msg.device_id] = msg
            while len(self._announced) > _MAX_ANNOUNCED:  # bounded: forged ids must not grow it forever
                oldest = next(d for d in self._announced if d not in self.worker_list)
                del self._announced[oldest]
            joinable = self._train_started and not msg.busy_with
            new = msg.device_id not in self.worker_list and msg.device_id not in self._joiners
            if joinable and new and self._resplits:
                self._joiners.append(msg.device_id)
                log.info("%s is available; it joins at the next re-partition", msg.device_id)
        elif isinstance(msg, ErrorReport):
            log.error("worker %s reports %s: %s", msg.device_id, msg.code, msg.reason)

    def on_arrival(self, sender: str, message: Message) -> None:
        # Network thread: liveness is stamped on arrival (see Role.on_arrival). Any message from a
        # worker is a sign of life, not only heartbeats: on a saturated slow uplink its heartbeats
        # wait behind the activations in the same TCP stream.
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

    def _notify(self, **values: Any) -> None:
        if self.progress is not None:
            self.progress(values)

    # -- evaluation ----------------------------------------------------------------------------

    def _eval_bound(self) -> int:
        """Evaluation chunks in flight: enough to keep every stage busy, few enough that a slow stage's
        inbox holds only a handful (the test set is streamed, not pushed in at once)."""
        return max(2, self._bound())

    def _evaluate(self, data: Dataset) -> tuple[float, float]:
        """Test accuracy with the newest weights, streamed through the pipeline in eval mode.

        At most :meth:`_eval_bound` chunks are in flight. The deadline is for the *next* result, derived
        from the measured step (planner/deadlines.py), so a long test set on a slow cluster is never cut
        off while results keep coming; a device that dies meanwhile is a fault like one in training
        (raised to the training loop, which recovers and evaluates again).
        """
        stage = self.stage
        bs = self.train.eval_batch_size
        n = data.x_test.shape[0]
        chunks = [(i, data.x_test[i : i + bs], data.y_test[i : i + bs]) for i in range(0, n, bs)]
        correct = 0
        loss_sum = 0.0
        if stage.is_last:
            for _, x, y in chunks:
                out = stage.evaluate(x)
                correct += int((out.argmax(dim=1) == y).sum())
                loss_sum += float(torch.nn.functional.cross_entropy(out, y, reduction="sum"))
            return correct / max(1, n), loss_sum / max(1, n)
        self._results.clear()
        self._eval_ids = {eid for eid, _, _ in chunks}
        bound, timeout = self._eval_bound(), self._eval_deadline()
        sent = 0
        last_result = time.monotonic()
        try:
            while len(self._results) < len(chunks):
                while sent < len(chunks) and sent - len(self._results) < bound:
                    self._send_eval_chunk(*chunks[sent])
                    sent += 1
                before = len(self._results)
                self._wait_for_messages()
                now = time.monotonic()
                if len(self._results) > before:
                    last_result = now
                elif now - last_result > timeout:
                    raise _Fault(
                        [],
                        f"evaluation results are late: {before} of {len(chunks)} in, none for "
                        f"{timeout:.1f} s (deadline from the measured step)",
                    )
        finally:
            self._eval_ids = set()
        for r in self._results.values():
            correct += r.correct
            loss_sum += r.loss_sum
        return correct / max(1, n), loss_sum / max(1, n)

    def _send_eval_chunk(self, eid: int, x: torch.Tensor, y: torch.Tensor) -> None:
        started = Clock()
        out = self.stage.evaluate(x)
        emulate_slowdown(started, self.config.slowdown, self.times)
        activation = self.runner.activation(
            out, y, run_id=self.run_id, plan_id=self.plan_id, batch_id=eid, version=0, mode="eval", epoch=0
        )
        self.codecs.message_sent(self.send(self.topics.activations(0), activation))

    # -- the trained model ---------------------------------------------------------------------

    def collect_weights(self) -> dict[str, torch.Tensor]:
        """The whole model's state, gathered from every stage (keys ``<layer>.<name>``)."""
        self._weights.clear()
        if len(self.worker_list) > 1:
            self.send(self.topics.fixed(Family.COMMAND), Collect(run_id=self.run_id))
        deadline = time.monotonic() + self.config.startup_timeout
        while len(self._weights) < len(self.worker_list) - 1:
            if time.monotonic() > deadline:
                missing = sorted(set(self.worker_list[1:]) - set(self._weights))
                raise TrainingError(f"workers {missing} did not send their weights")
            item = self.next_message(0.2)
            if item is not None:
                self._handle_background(item)
        state: dict[str, torch.Tensor] = {}
        for part in [self.stage.state(), *(w.tensors for w in self._weights.values())]:
            for key, value in part.items():
                state[key.removeprefix("layers.")] = value
        return state

    def _save_model(self, spec: ModelSpec) -> None:
        path = self.config.save_model
        assert path is not None
        state = self.collect_weights()
        torch.save(state, path)
        log.info("saved the trained model (%d layers, %d tensors) to %s", num_layers(spec), len(state), path)
