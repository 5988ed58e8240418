"""The run context: everything one pipeline run on the central node knows, shared by the run's parts.

:class:`RunState` is built in two steps by the run (:class:`~.run.PipelineRun`), once the devices, the
data and the model are known: its constructor profiles the layers and sets every field; :meth:`RunState.begin`
then takes the first split (which the planning part computes from this state) and builds the report and
stage 0. The parts of the run (setup, estimation, planning, liveness, checkpoints, handlers, switching,
evaluation, recovery, the trainer: one module each) hold this state and the parts below them; the node
(:mod:`edgeagent.roles.central.node`) owns the runtime (transport, inbox, heartbeats) and hands it to the run.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from edgeagent.compression.stage import StageCodecs
from edgeagent.config import CentralConfig
from edgeagent.data import Dataset, batches_per_epoch
from edgeagent.injected import parse_slowdown_change
from edgeagent.models import ModelSpec, build_model
from edgeagent.pipeline.build import build_stage
from edgeagent.pipeline.catchup import Pieces
from edgeagent.pipeline.groups import Groups
from edgeagent.pipeline.runner import STAGE_TIME_WINDOW, StageRunner, log_bound
from edgeagent.pipeline.stage import Stage
from edgeagent.pipeline.step import StageStep
from edgeagent.planner.deadlines import Deadlines
from edgeagent.planner.dp import Link, TieBreak
from edgeagent.planner.policy import RepartitionPolicy
from edgeagent.planner.profiler import LayerProfile, profile_layers
from edgeagent.planner.recovery import Stalls
from edgeagent.predictor.tracker import DeviceTimes
from edgeagent.protocol.commands import SetReplication
from edgeagent.protocol.identity import PlanView
from edgeagent.protocol.messages import (
    Announce,
    EvalResult,
    Event,
    Gradient,
    LinkReport,
    Message,
    Ready,
    Weights,
)
from edgeagent.protocol.options import TrainOptions, milestone_steps
from edgeagent.protocol.topics import Family
from edgeagent.replication.period import (
    RATE_WINDOW,
    ChainPoints,
    chain_period,
    measured_batch_seconds,
    planned_batch_seconds,
    retune,
)
from edgeagent.replication.store import WeightStore, snapshots_kept
from edgeagent.replication.switch import Switch
from edgeagent.roles.central.report import RunReport

if TYPE_CHECKING:
    from edgeagent.roles.central.node import Central, DeviceState

log = logging.getLogger("edgeagent.roles.central")
# Gradients whose stage times the drift check takes the median of: each time is already a mean over
# STAGE_TIME_WINDOW batches, so one slow batch (a collection, an evaluation beside it) lifts that many
# consecutive times; over three windows' worth the median is the stage's steady time.
DRIFT_HISTORY = 3 * STAGE_TIME_WINDOW


@dataclass(frozen=True)
class Fault:
    """A fault the run detected (Sec. III-F): returned to the training loop, which recovers."""

    dead: list[str]
    reason: str


@dataclass(frozen=True)
class Plan:
    """What the planning job proposes: a split over a worker list (longer than now if devices joined)."""

    points: list[int]
    predicted: float
    reason: str
    workers: list[str]
    groups: Groups | None = None  # hybrid stages: every stage's devices (primaries are ``workers``)


@dataclass
class Inbox:
    """What the handlers collected for the run's waits (the training loop, evaluation, switches)."""

    gradients: dict[int, Gradient] = field(default_factory=dict)
    results: dict[int, EvalResult] = field(default_factory=dict)
    weights: dict[str, Weights] = field(default_factory=dict)  # answers to "collect"
    links: dict[str, LinkReport] = field(default_factory=dict)
    ready: dict[int, dict[str, str]] = field(default_factory=dict)  # plan id -> device -> phase
    alive: dict[str, Ready] = field(default_factory=dict)  # answers to a recovery's ping
    eval_ids: set[int] = field(default_factory=set)  # evaluation batches whose results are due
    error: str = ""  # the latest error a worker of the run reported ("" for none)
    diverged: str = ""  # the last stage says the loss is not finite (why; "" while it is)


class RunState:
    """One run's state; see the module's docstring. ``resume`` is a loaded checkpoint (or None)."""

    def __init__(
        self,
        node: Central,
        config: CentralConfig,
        data: Dataset,
        spec: ModelSpec,
        worker_list: list[str],
        *,
        resume: dict[str, Any] | None = None,
        mode: str = "pipeline",
    ) -> None:
        self.node = node
        self.mode = mode  # what the assignments name (Assign.mode): the worker half of this run
        self.topics = node.topics
        self.device_id = node.device_id
        self.times = node.times
        self.config = config
        self.train = config.train
        self.run_id = node.run_id
        self.data = data
        self.spec = spec
        self.resume = resume
        self.start_version = int(resume["version"]) if resume else 0
        # Plan ids above the dead central node's, so that no stale message of its plans is taken.
        self.plan_id = int(resume["plan_id"]) + 1 if resume else 0
        self.plan_counter = self.plan_id
        self.workers: dict[str, DeviceState] = node.workers  # shared: the network thread stamps liveness
        self.announced: dict[str, Announce] = node.announced
        self.worker_list = list(worker_list)
        self.per_epoch = batches_per_epoch(data.x_train.shape[0], self.train.batch_size)
        total = self.per_epoch * self.train.epochs
        self.total = min(total, self.train.max_batches) if self.train.max_batches else total
        self.store = WeightStore(config.device_id, keep=snapshots_kept(0.0))  # see Setup.subscribe_stage
        # Batches between chain replications under the current plan: chain_every, or chain_seconds turned
        # into batches (replication.period; set by begin(), refreshed at every switch: period_for_plan).
        self.chain_every = config.chain_every
        self.chain = ChainPoints(config.chain_every)  # the points of the current plan (stage 0's too)
        self.chain_since = 0  # the batch the current plan's first commit follows (the rate window's start)
        self.checkpointed = -1  # the version of the last checkpoint written (Checkpoints._maybe_checkpoint)
        self.inbox = Inbox()
        self.status = 0  # Table I: 1 while recovering from a fault
        self.grace_until = 0.0
        self.train_started = 0.0  # perf_counter at the first batch; 0 during set-up
        self.eval_seconds = 0.0
        self.last_progress = 0.0
        self.policy = RepartitionPolicy(config.repartition_first, config.repartition_every)
        self.stalls = Stalls()  # recoveries in a row without progress (the run ends at the limit)
        self.deadlines = Deadlines(
            config.timeout_multiplier, config.batch_timeout, config.probe_timeout, config.startup_timeout
        )
        self.batch_deadline = config.batch_timeout  # from the measured step: see refresh_deadline
        self.known_caps: dict[str, float] = {}  # the latest measured capacity of every device
        self.options = TrainOptions.of(self.train)
        self.options = dataclasses.replace(
            self.options,
            total_batches=self.total,
            lr_steps=milestone_steps(self.train.lr_milestones, self.per_epoch),
        )
        if self.train.schedule == "sync":
            # One micro-batch per stage unless set, never more than the batch has rows.
            micro = min(self.train.micro_batches or len(self.worker_list), self.train.batch_size)
            self.options = dataclasses.replace(self.options, micro_batches=micro)
        else:
            self.options = dataclasses.replace(self.options, micro_batches=0)
        self.changes = sorted((parse_slowdown_change(c) for c in config.slowdown_changes), key=lambda c: c[1])
        self.sent_at: dict[int, float] = {}
        # device -> monotonic time until which its stage may be stalled measuring h (ask_h, on_h):
        # batch timers do not expire before then.
        self.measuring: dict[str, float] = {}
        self.batch_orders: dict[int, list[torch.Tensor]] = {}  # the current epoch's batch order
        self.stage_times: list[float] = []  # latest per-stage seconds per batch, stage 1 onwards
        # The stage times of the last gradients (DRIFT_HISTORY), for the drift check's median.
        self.stage_history: deque[tuple[float, ...]] = deque(maxlen=DRIFT_HISTORY)
        self.plan_job: Future[Plan] | None = None
        self.codecs = StageCodecs()
        self.bits: tuple[list[int], list[int]] | None = None
        self.joiners: list[str] = []
        self.switch: Switch | None = None
        self.catchup: Pieces | None = None  # what a recovery without a rollback collects (central/catchup.py)
        self.links: list[Link] = []  # measured once the workers are built (setup)
        # Every device's measured uplink, the last stage's to the central node included (not a link of
        # the pipeline's DP, but what its replicas, fetched layers and heartbeats cross): the waits'.
        self.uplinks: dict[str, Link] = {}
        # Workers whose real uplink was measured slow and whose replicas are paced on it (Mbit/s).
        self.paced_uplinks: dict[str, float] = {}
        self.groups = Groups.single(self.worker_list)  # the devices of every stage (hybrid: several)
        model = build_model(spec, seed=self.train.seed)
        self.param_bytes = tuple(
            sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in model
        )
        # Batch normalisation in the model: a replicated stage's members then need enough rows each.
        self.normalises = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
        self.profile = self._profile(model)
        self.characterisations: list[dict[str, Any]] = []  # every h taken (copied into the report)
        self.h_changed = False  # with the predictor: a device's h changed since the last plan
        # With the predictor: the batch of an extra plan check after a re-plan for a standing gap (None:
        # none), and how many such checks came in a row (at most GAP_RECHECKS).
        self.recheck_at: int | None = None
        self.rechecks = 0
        # With the predictor: the run's DeviceTimes (Estimation.load_device_times; None: FTPipeHD's capacity).
        self.device_times: DeviceTimes | None = None
        # Set by begin(): the split, the report, the starting weights and stage 0's data path.
        self.points: list[int] = []
        self.report: RunReport
        self.initial: dict[str, torch.Tensor] | None = None
        self.initial_momentum: dict[str, torch.Tensor] | None = None
        self.runner: StageRunner
        # Stage 0's compute step and what it sends (pipeline/step.py: the one copy every stage uses).
        self.stage_step = StageStep(self.send, self.topics, self.device_id, self.times)

    def begin(self, points: list[int]) -> None:
        """The second step of the construction, once ``device_times`` is set: the first split (``points``;
        a checkpoint's when the run resumes one of the same length), then the report and stage 0."""
        self.points = points
        resume = self.resume
        if resume is not None and len(resume["points"]) == len(self.worker_list) + 1:
            self.points = list(resume["points"])
        self.report = self._new_report()
        self.chain_every = self.period_for_plan()
        self.chain = ChainPoints(self.chain_every)
        self.chain_since = self.start_version
        self.initial, self.initial_momentum = self._start_weights()
        stage = build_stage(
            self.spec,
            seed=self.train.seed,
            options=self.options,
            points=self.points,
            index=0,
            weights=self.initial,
            momentum_buffers=self.initial_momentum,
            version=self.start_version,
            in_flight=self.bound(),
            # Stage 0 with helpers (hybrid) waits for their gradient sums: a replicated stage's delay.
            replicated=len(self.groups.members[0]) > 1,
        )
        # Stage 0's data path (pipeline/runner.py); it keeps what it sent for a recovery without a rollback.
        without_rollback = self.config.recovery_mode == "resume"
        keep = log_bound(self.chain_every, self.bound()) if without_rollback else 0
        self.runner = StageRunner(stage, 0, codecs=self.codecs, log_keep=keep)

    # -- what every part of the run uses -------------------------------------------------------

    @property
    def stage(self) -> Stage:
        return self.runner.stage

    @property
    def resplits(self) -> bool:
        """Whether the split follows measurements (FTPipeHD). ResPipe, the baseline, never re-splits: the
        next worker takes a dead one's layers and keeps them (papers/002)."""
        return self.config.partition == "dynamic" and self.config.recovery != "respipe"

    @property
    def tie_break(self) -> TieBreak:
        """The pipeline DP's rule among splits with the optimal bottleneck (planner.dp.solve):
        ``--tie-break``, else ``slack`` when the latency predictor plans (its times are noisy: keep slow
        devices' shares small) and ``latest``, the paper's rule, for the baselines (capacity estimate,
        oracle, uniform)."""
        if self.config.tie_break is not None:
            return self.config.tie_break
        return "slack" if self.device_times is not None else "latest"

    def bound(self) -> int:
        return self.train.in_flight or len(self.worker_list)

    def paces(self, device: str) -> bool:
        """Whether the run paces replicas and ``device``'s uplink is paced: an emulated slow link (its
        announce says so) or a real one measured slow (:meth:`Setup.pace_slow_uplinks`)."""
        announce = self.announced.get(device)
        paced = (announce is not None and announce.paces) or device in self.paced_uplinks
        return self.config.replica_share > 0 and paced

    def replica_share(self) -> float:
        """The run's ``replica_share`` if one of its workers paces its uplink, else 0: replicas go at once
        and every store keeps the paper's few snapshots (paced replicas lag, so stores keep more)."""
        return self.config.replica_share if any(self.paces(d) for d in self.worker_list[1:]) else 0.0

    def new_plan_period(self, version: int) -> None:
        """A new plan goes on from ``version``: its period (:meth:`period_for_plan`), which its order
        carries, counted from 0 as every stage's."""
        self.chain_every = self.period_for_plan()
        self.chain = ChainPoints(self.chain_every)
        self.chain_since = version

    def retune_chain(self, done: int) -> None:
        """ResPipe's T in seconds, once a plan has committed :data:`RATE_WINDOW` batches: the period at
        the rate measured under it, to every stage from a batch none has finished (``replication``)."""
        seconds = self.config.chain_seconds
        if seconds is None or done != self.chain_since + RATE_WINDOW:
            return
        recent = self.report.timeline[-RATE_WINDOW:]  # under this plan only
        per_batch = measured_batch_seconds([float(e["t"]) for e in recent])
        # Past every batch a stage may have finished (in flight, twice over) and the command's way there.
        margin = 2 * self.bound() + 8
        points = retune(self.chain, seconds, per_batch, done, margin)
        if points is None or per_batch is None:
            return
        self.chain, self.chain_every = points, points.every
        self.send(
            self.topics.fixed(Family.COMMAND),
            SetReplication(
                run_id=self.run_id, plan_id=self.plan_id, from_batch=points.start, chain_every=points.every
            ),
        )
        log.info(
            "chain replication every %d batches from batch %d (T = %g s at %.4f s per batch measured)",
            points.every,
            points.start,
            seconds,
            per_batch,
        )
        entry = {
            "batch": done,
            "from_batch": points.start,
            "chain_every": points.every,
            "batch_seconds": per_batch,
        }
        self.report.chain_periods.append(entry)
        self.event("chain_period", **entry)

    def period_for_plan(self) -> int:
        """Batches between chain replications for the plan about to be sent: ``chain_every``, or ResPipe's
        T in seconds (``chain_seconds``) at the measured time per committed batch, or before any was
        committed at the planned step (the slowest stage of the split on the central node's profile, the
        workers taken as equal to it)."""
        seconds = self.config.chain_seconds
        if seconds is None:
            return self.config.chain_every
        recent = self.report.timeline[-(RATE_WINDOW + 1) :]
        per_batch = measured_batch_seconds([float(e["t"]) for e in recent])
        if per_batch is None:
            layers = self.profile.seconds
            stages = [sum(layers[a:b]) for a, b in zip(self.points, self.points[1:], strict=False)]
            if stages:
                stages[0] *= self.config.slowdown
            per_batch = planned_batch_seconds(stages)
        period = chain_period(self.config.chain_every, seconds, per_batch, current=self.chain_every)
        log.info(
            "chain replication every %d batches (T = %g s at %s s per batch)",
            period,
            seconds,
            f"{per_batch:.4f}" if per_batch is not None else "an unknown",
        )
        return period

    def plan_view(self) -> PlanView:
        """Who holds each stage now: stage outputs are taken only from them (protocol/identity.py)."""
        return PlanView(self.run_id, self.plan_id, self.groups.members)

    def send(self, topic: str, message: Message, *, retain: bool = False) -> int:
        return self.node.send(topic, message, retain=retain)

    def listen(self, topic: str) -> None:
        self.node.listen(topic)

    def stop_listening(self, topic: str) -> None:
        self.node.stop_listening(topic)

    def event(self, name: str, **details: Any) -> None:
        self.send(self.topics.fixed(Family.EVENTS), Event(name=name, run_id=self.run_id, details=details))

    def notify(self, **values: Any) -> None:
        if self.node.progress is not None:
            self.node.progress(values)

    def clock(self) -> float:
        """Training seconds so far (evaluation excluded): the time axis of the report."""
        return time.perf_counter() - self.train_started - self.eval_seconds

    # -- built once --------------------------------------------------------------------------

    def _profile(self, model: torch.nn.Sequential) -> LayerProfile:
        sample = self.data.x_train[: self.train.batch_size]
        profile = profile_layers(list(model), sample, runs=10)
        log.info(
            "profiled %d layers: %.2f ms per batch in all", len(profile.seconds), 1e3 * sum(profile.seconds)
        )
        return profile

    def _new_report(self) -> RunReport:
        report = RunReport(
            run_id=self.run_id,
            model=self.train.model,
            dataset=self.data.name,
            workers=self.worker_list[1:],
            in_flight=self.bound(),
            staleness=self.train.staleness,
            schedule=self.train.schedule,
            micro_batches=max(1, self.options.micro_batches),
            momentum=self.train.momentum,
            learning_rate=self.train.learning_rate,
            layer_profile=self.profile.to_dict(),
            partition_mode=self.config.partition,
            mode=self.mode,
            estimator="predictor" if self.device_times is not None else "capacity",
            tie_break=self.tie_break,
            characterisations=self.characterisations,
        )
        if self.resume is not None:
            for key in ("test_accuracy_per_epoch", "test_loss_per_epoch", "train_loss_per_epoch"):
                getattr(report, key).extend(self.resume["history"][key])
            report.recoveries.append(
                {"case": "central", "resumed_from": self.resume["version"], "checkpoint": self.config.resume}
            )
        return report

    def _start_weights(self) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None]:
        """(weights, momentum) the run starts from: a checkpoint's, pre-trained weights (continuous
        learning, renamed to the stage modules' ``layers.<j>.`` keys), or none (the seed's)."""
        if self.resume is not None:
            return self.resume["weights"], self.resume["momentum"]
        if not self.train.init_weights:
            return None, None
        state = torch.load(self.train.init_weights, map_location="cpu", weights_only=True)
        return {k if k.startswith("layers.") else f"layers.{k}": v for k, v in state.items()}, None
