"""The worker: runs one pipeline stage, as the central node assigns it, and moves layers when it re-splits."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from edgeagent import __version__
from edgeagent.compression.stage import NONE, StageCodecs
from edgeagent.config import WorkerConfig
from edgeagent.errors import ConfigError, EdgeAgentError, TrainingError
from edgeagent.models import ModelSpec
from edgeagent.ops.profiles import DeviceProfile, parse_profile
from edgeagent.ops.systemd import Notifier, Watchdog, watchdog_interval
from edgeagent.pipeline.build import TrainOptions, build_stage
from edgeagent.pipeline.runner import StageRunner
from edgeagent.pipeline.schedule import Kind, admit, next_kind, stage_bound
from edgeagent.pipeline.stage import Stage
from edgeagent.protocol.limits import InboxLimits, TensorMeta
from edgeagent.protocol.messages import (
    Activation,
    Announce,
    Assign,
    Collect,
    Command,
    Commit,
    Discover,
    Emulate,
    ErrorReport,
    EvalResult,
    FetchRequest,
    Gradient,
    LinkReport,
    MeasureLink,
    Ping,
    Profile,
    Ready,
    Repartition,
    SetCompression,
    Status,
    Stop,
    Weights,
)
from edgeagent.protocol.topics import Family, Topics
from edgeagent.replication.store import WeightStore, replica_message
from edgeagent.replication.switch import Switch, serve_fetch
from edgeagent.runtime.compute import Clock, configure_threads, emulate_slowdown
from edgeagent.runtime.probes import LinkProbes
from edgeagent.runtime.role import Inbound, Role
from edgeagent.transport.base import Transport

log = logging.getLogger(__name__)

EVAL_QUEUE_LIMIT = 4096  # evaluation batches waiting here (a test set of 1M samples in batches of 256)


def stage_input(spec: ModelSpec, start: int, shapes: list[list[int]], dtypes: list[str]) -> TensorMeta | None:
    """One sample of what layer ``start`` takes, from the central node's layer profile (``Assign``):
    the output of layer ``start - 1``. None when the assignment carried no profile: only the batch and
    the labels of incoming activations are then checked."""
    if start == 0:
        return tuple(spec.in_shape), torch.float32  # the data sets are float32
    if len(shapes) < start or len(dtypes) < start:
        return None
    dtype = getattr(torch, dtypes[start - 1], None)
    if not isinstance(dtype, torch.dtype):
        return None
    return tuple(shapes[start - 1]), dtype


@dataclass
class _Run:
    """What a worker knows about the run it is in; the plan part changes at every re-partition."""

    run_id: str
    spec: ModelSpec
    seed: int
    options: TrainOptions
    plan_id: int
    points: list[int]
    worker_list: list[str]
    index: int
    runner: StageRunner  # the stage and its data path (pipeline/runner.py)
    subscriptions: list[str] = field(default_factory=list)
    forwards: dict[int, Activation] = field(default_factory=dict)
    backwards: dict[int, Gradient] = field(default_factory=dict)
    evals: list[Activation] = field(default_factory=list)
    next_forward: int = 0
    next_backward: int = 0
    last: Kind | None = None
    batches: int = 0  # backward passes done under this plan
    samples: int = 0  # training samples through this stage in the run (all plans)
    switch: Switch | None = None
    chain_every: int = 50
    global_every: int = 100
    replicas: int = 1
    batches_per_epoch: int = 0
    batch_size: int = 0  # of the latest training batch here
    run_bits: int = 32  # the central node's choice of activation bits for this stage (a profile may override)
    in_flight: int = 4  # the central node's bound on batches in flight (Assign.in_flight)
    sample: TensorMeta | None = None  # one sample of this stage's input (see stage_input)
    layer_shapes: list[list[int]] = field(default_factory=list)  # Assign.layer_shapes
    layer_dtypes: list[str] = field(default_factory=list)

    @property
    def stage(self) -> Stage:
        return self.runner.stage

    @property
    def codecs(self) -> StageCodecs:
        return self.runner.codecs

    @property
    def window(self) -> int:
        """How far ahead of ``next_forward`` a legitimate training batch can be: the central node keeps at
        most ``in_flight`` batches in flight, and every stage forwarded each of them before it commits
        one; twice that (or the number of stages, which joiners may raise) and some slack."""
        return 2 * max(self.in_flight, self.num_stages) + 16

    @property
    def num_stages(self) -> int:
        return len(self.points) - 1

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1

    def matches(self, run_id: str, plan_id: int) -> bool:
        return run_id == self.run_id and plan_id == self.plan_id


_ERROR_REPORTS_PER_10S = 10


class Worker(Role):
    def __init__(
        self, config: WorkerConfig, transport: Transport | None = None, *, limits: InboxLimits | None = None
    ) -> None:
        topics = Topics(config.cluster)
        self.config = config
        self.slowdown = config.slowdown
        self._owns_transport = transport is None
        if transport is None:
            transport = Role.mqtt_transport(topics, config.device_id, config, link_mbps=config.link_mbps)
        super().__init__(transport, topics, config.device_id, limits=limits)
        self.run_state: _Run | None = None
        self.completed_runs = 0
        self.probes = LinkProbes(self)
        self.store = WeightStore(config.device_id)
        self.memory_limit_mb = config.memory_limit_mb
        self.link_mbps = config.link_mbps
        self.profile: DeviceProfile | None = None  # the last good one
        self._stopping = False
        self._error_window: tuple[float, int] = (0.0, 0)  # (start, reports) of the error-report budget
        self._eval_batches = 0  # evaluation batches taken in this process's life (fault injection)

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

    def announce(self) -> None:
        busy = self.run_state.run_id if self.run_state else ""
        self.send(
            self.topics.fixed(Family.ANNOUNCE),
            Announce(
                device_id=self.device_id,
                busy_with=busy,
                threads=self.config.threads,
                slowdown=self.slowdown,
                software=__version__,
                memory_limit=self.memory_limit_mb * 1e6,
                profile_hash=self.profile.digest() if self.profile else "",
            ),
        )

    # -- the loop ------------------------------------------------------------------------------

    def _step(self) -> None:
        run = self.run_state
        work = run is not None and (self._ready(run) is not None or bool(run.evals))
        item = self.next_message(0 if work else 0.5)
        while item is not None:
            try:
                self._handle(item)
            except EdgeAgentError as exc:
                log.error("%s: %s (from %s); message dropped", self.device_id, exc, item.sender)
                self._report_error("message", str(exc))
            item = self.next_message(0)
        run = self.run_state
        if run is None:
            return
        try:
            if run.evals:
                self._evaluate(run, run.evals.pop(0))
                return
            kind = self._ready(run)
            if kind == "F":
                self._forward(run, run.forwards.pop(run.next_forward))
            elif kind == "B":
                self._backward(run, run.backwards.pop(run.next_backward))
        except EdgeAgentError as exc:
            log.error("%s: %s; the batch is dropped", self.device_id, exc)
            self._report_error("compute", str(exc))

    @staticmethod
    def _activation_problem(run: _Run, msg: Activation) -> str | None:
        """Why an activation of the current run and plan cannot be taken here, or None.

        Checked on receipt: a batch that does not fit would make the forward pass raise (or, kept until
        then, take the place of the legitimate batch of the same id).
        """
        if msg.stage != run.index - 1:
            return f"it comes from stage {msg.stage}, this stage takes stage {run.index - 1}'s"
        if msg.mode == "eval":
            if msg.batch_id < 0:
                return "negative batch id"
            if len(run.evals) >= EVAL_QUEUE_LIMIT:
                return f"{len(run.evals)} evaluation batches already wait here"
        elif msg.mode != "train":
            return f"mode {msg.mode!r} is neither train nor eval"
        elif msg.batch_id >= run.next_forward + run.window:
            return (
                f"more than {run.window} batches ahead of the next one here ({run.next_forward}); "
                "no such batch can be in flight"
            )
        return None  # the tensors are checked by the stage's runner (after decompression)

    def _ready(self, run: _Run) -> Kind | None:
        if run.switch is not None:
            return None  # drained for a re-partition; nothing should arrive, and nothing runs
        held = run.next_forward - run.next_backward  # batches forwarded here whose backward is due
        fwd = run.next_forward in run.forwards and (
            run.is_last or admit(held, stage_bound(run.in_flight, run.index))
        )
        bwd = (not run.is_last) and run.next_backward in run.backwards
        return next_kind(run.last, fwd, bwd)

    def _handle(self, item: Inbound) -> None:
        msg = item.message
        run = self.run_state
        if isinstance(msg, Activation):
            if run is None or not run.matches(msg.run_id, msg.plan_id):
                return  # a stale batch from an earlier run or plan
            if msg.mode == "train" and msg.batch_id < run.next_forward:
                return  # a duplicate delivery (QoS 1)
            problem = self._activation_problem(run, msg)
            taken: Activation | None = None
            if problem is not None:
                problem = f"activation of batch {msg.batch_id}: {problem}"
            else:
                taken, problem = run.runner.take_activation(
                    msg, sample=run.sample, num_classes=run.spec.num_classes
                )
            if taken is None:
                self.discard(item, problem or "")
            elif taken.mode == "eval":
                run.evals.append(taken)
            else:
                run.forwards[taken.batch_id] = taken
        elif isinstance(msg, Gradient):
            if run is None or not run.matches(msg.run_id, msg.plan_id) or msg.batch_id < run.next_backward:
                return
            grad, problem = run.runner.take_gradient(msg)
            if grad is None:
                self.discard(item, problem or "")
                return
            run.backwards[grad.batch_id] = grad

        elif isinstance(msg, Assign):
            self._assign(msg)
        elif isinstance(msg, Repartition):
            self._repartition(msg)
        elif isinstance(msg, FetchRequest):
            if run is not None and msg.owner == self.device_id and msg.run_id == run.run_id:
                reply = serve_fetch(self.store, run.stage, msg, run.spec, run.seed, run.run_id)
                self.send(self.topics.device(Family.REPLICA, self.device_id), reply)
        elif isinstance(msg, Weights):
            if run is None or msg.run_id != run.run_id:
                return
            if msg.purpose == "chain" and msg.plan_id == run.plan_id:
                self.store.add_replica(msg)
            elif msg.purpose == "redistribute" and run.switch is not None and run.switch.accept(msg):
                self._maybe_fetched(run)
        elif isinstance(msg, Commit):
            switch = run.switch if run is not None and msg.run_id == run.run_id else None
            if run is not None and switch is not None and msg.plan_id == switch.plan_id:
                self._commit(run, switch)
        elif isinstance(msg, Command):
            self._command(msg)
        elif isinstance(msg, Status):
            if run is not None and msg.device_id == run.worker_list[0] and msg.state in ("idle", "left"):
                log.warning(
                    "%s: the central node %s is idle, so run %s is over, but its stop never came here; "
                    "leaving the run",
                    self.device_id,
                    msg.device_id,
                    run.run_id,
                )
                self._end_run(run)
        elif isinstance(msg, Profile):
            self._apply_profile(msg)
        elif isinstance(msg, Discover):
            self.announce()
        else:
            log.debug("%s ignores %s on %s", self.device_id, msg.KIND.value, item.topic.family.value)

    # -- set-up --------------------------------------------------------------------------------

    def _assign(self, msg: Assign) -> None:
        if self.run_state is not None and self.run_state.run_id != msg.run_id:
            self._report_error("busy", f"already training run {self.run_state.run_id}", msg.run_id)
            return
        if self.device_id not in msg.worker_list:
            self._report_error("assign", f"not in the worker list {msg.worker_list}", msg.run_id)
            return
        index = msg.worker_list.index(self.device_id)
        options = TrainOptions(
            learning_rate=msg.learning_rate,
            momentum=msg.momentum,
            weight_decay=msg.weight_decay,
            aggregation=msg.aggregation,
            aggregation_interval=msg.aggregation_interval,
        )
        try:
            spec = ModelSpec.from_dict(msg.model)
            # A resumed or recovering run starts at the version after the committed backward id.
            stage = build_stage(
                spec,
                seed=msg.seed,
                options=options,
                points=msg.points,
                index=index,
                weights=msg.weights,
                momentum_buffers=msg.momentum_buffers,
                version=msg.committed_backward_id + 1,
            )
        except (ValueError, EdgeAgentError) as exc:
            self._report_error("assign", f"cannot build stage {index}: {exc}", msg.run_id)
            return
        if self.run_state is not None:
            self._leave_run()
        start_id = msg.committed_backward_id + 1
        self.store.clear()
        run = _Run(
            msg.run_id,
            spec,
            msg.seed,
            options,
            msg.plan_id,
            list(msg.points),
            list(msg.worker_list),
            index,
            StageRunner(stage, index),
            next_forward=start_id,
            next_backward=start_id,
            chain_every=msg.chain_every,
            global_every=msg.global_every,
            replicas=msg.replicas,
            batches_per_epoch=msg.batches_per_epoch,
            in_flight=msg.in_flight,
            layer_shapes=msg.layer_shapes,
            layer_dtypes=msg.layer_dtypes,
        )
        self.run_state = run
        self.set_metrics_interval(msg.metrics_interval)
        # The central node's retained status: "idle" means its run is over, even if our "stop" was lost.
        self.listen(self.topics.device(Family.STATUS, run.worker_list[0]))
        self._subscribe_stage(run)
        self.times.reset()
        self.set_status("training", run_id=msg.run_id, stage=index)
        log.info(
            "%s: stage %d of %d, layers [%d, %d), %d parameters",
            self.device_id,
            index,
            run.num_stages,
            run.points[index],
            run.points[index + 1],
            sum(p.numel() for p in stage.module.parameters()),
        )
        if msg.status == 0 and (msg.weights is not None or start_id > 0):
            # The run starts from given weights (--resume, --init-weights): replicate them before
            # "built", so that a rollback never goes past them to the seeded model (Sec. III-E).
            self._replicate_now(run)
        self._say_ready(run, "built")

    def _subscribe_stage(self, run: _Run) -> None:
        """Listen to the stage's inputs: activations of the stage before, gradients of the stage after."""
        run.sample = stage_input(run.spec, run.points[run.index], run.layer_shapes, run.layer_dtypes)
        for pattern in run.subscriptions:
            self.stop_listening(pattern)
        run.subscriptions = [self.topics.activations(run.index - 1)]
        if not run.is_last:
            run.subscriptions.append(self.topics.gradients(run.index + 1))
        # Chain replicas of the ``replicas`` stages before this one, wrapping around after the last stage
        # as planner.recovery.holders_of does (never of the central node's stage 0, which keeps its own).
        n = len(run.worker_list)
        for k in range(1, min(run.replicas, n - 1) + 1):
            source = (run.index - k) % n
            if source >= 1:
                run.subscriptions.append(self.topics.device(Family.REPLICA, run.worker_list[source]))
        for pattern in run.subscriptions:
            self.listen(pattern)
        self.probes.unwatch_all()
        self.probes.watch(run.worker_list[run.index - 1])  # echo the predecessor's bandwidth probes

    def _say_ready(self, run: _Run, phase: str) -> None:
        self.send(
            self.topics.device(Family.REPLY, self.device_id),
            Ready(
                run_id=run.run_id,
                plan_id=run.switch.plan_id if run.switch else run.plan_id,
                device_id=self.device_id,
                stage=run.index,
                parameters=sum(p.numel() for p in run.stage.module.parameters()),
                phase=phase,
            ),
        )

    def _leave_run(self) -> None:
        run = self.run_state
        if run is None:
            return
        for pattern in run.subscriptions:
            self.stop_listening(pattern)
        self.stop_listening(self.topics.device(Family.STATUS, run.worker_list[0]))
        self.probes.unwatch_all()
        self.run_state = None
        self.completed_runs += 1
        self.set_status("idle")

    # -- re-partition (Sec. III-D) -------------------------------------------------------------

    def _repartition(self, msg: Repartition) -> None:
        run = self.run_state
        if run is None or msg.run_id != run.run_id or msg.plan_id <= run.plan_id:
            return
        try:
            switch = Switch.start(self.device_id, msg, self.store, run.stage, run.spec, run.seed)
        except (TrainingError, ValueError) as exc:
            self._report_error("repartition", f"plan {msg.plan_id}: {exc}", run.run_id)
            return
        if switch is None:
            log.info("%s: no stage in plan %d; leaving the run", self.device_id, msg.plan_id)
            self._leave_run()
            return
        run.switch = switch
        for holder in switch.holders:
            self.listen(self.topics.device(Family.REPLICA, holder))
        for request in switch.requests():
            self.send(self.topics.device(Family.REQUEST, self.device_id), request)
        log.info(
            "%s: plan %d, layers [%d, %d): keeping %s, fetching %s",
            self.device_id,
            msg.plan_id,
            switch.plan.start,
            switch.plan.end,
            list(switch.plan.local),
            {k: list(v) for k, v in switch.plan.fetch.items()},
        )
        self._maybe_fetched(run)

    def _maybe_fetched(self, run: _Run) -> None:
        if run.switch is not None and run.switch.complete:
            self._say_ready(run, "fetched")

    def _commit(self, run: _Run, switch: Switch) -> None:
        stage = switch.build(run.spec, run.seed, run.options)
        for holder in switch.plan.fetch:
            self.stop_listening(self.topics.device(Family.REPLICA, holder))
        order = switch.order
        run.plan_id, run.points, run.worker_list = order.plan_id, list(order.points), list(order.worker_list)
        run.index, run.switch = switch.plan.stage, None
        # A new stage, a new data path; the codecs stay until the central node names the new ones.
        run.runner = StageRunner(stage, run.index, codecs=run.codecs)
        run.forwards.clear()
        run.backwards.clear()
        run.evals.clear()
        run.next_forward = run.next_backward = order.version
        run.last, run.batches = None, 0
        self._subscribe_stage(run)
        self._replicate_now(run)
        self.set_status("training", run_id=run.run_id, stage=run.index)
        self._say_ready(run, "built")

    # -- device profiles (operations) ---------------------------------------------------------

    def _forward_bits(self, run_choice: int) -> int:
        """The bits of this device's outgoing activations: its profile's override, or the run's."""
        override = self.profile.compression if self.profile else "run"
        if override == "run":
            return run_choice
        return NONE if override == "none" else int(override)

    def _apply_profile(self, msg: Profile) -> None:
        """Apply what can change live; keep the last good profile if this one is invalid."""
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
            self._report_error("profile", str(exc))
            state = "training" if self.run_state else "idle"
            self.set_status(
                state, run_id=self._status.run_id, stage=self._status.stage, detail=f"profile rejected: {exc}"
            )
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
        if self.run_state is not None:
            codecs = self.run_state.codecs
            codecs.set_bits(self._forward_bits(self.run_state.run_bits), codecs.backward_bits)
        detail = f"profile {profile.digest()} applied"
        if restart:
            detail += f"; restart to apply {restart}"
        log.info("%s: %s", self.device_id, detail)
        state = "training" if self.run_state else "idle"
        self.set_status(state, run_id=self._status.run_id, stage=self._status.stage, detail=detail)
        if self.run_state is None:
            self.announce()  # the birth message carries the profile's hash

    # -- commands ------------------------------------------------------------------------------

    def _command(self, msg: Command) -> None:
        run = self.run_state
        if run is None or msg.run_id != run.run_id:
            return  # commands belong to a run: another run's (or a forged one's) are not ours
        if isinstance(msg, Emulate):
            if msg.device == self.device_id:
                log.info("%s: slowdown %.1f -> %.1f", self.device_id, self.slowdown, msg.slowdown)
                self.slowdown = msg.slowdown
        elif isinstance(msg, Collect):
            self._send_weights(run, purpose="collect")
        elif isinstance(msg, SetCompression):
            self._set_compression(run, msg)
        elif isinstance(msg, Ping):
            self.send(
                self.topics.device(Family.REPLY, self.device_id),
                Ready(
                    run_id=run.run_id,
                    plan_id=run.plan_id,
                    device_id=self.device_id,
                    stage=run.index,
                    parameters=0,
                    phase="alive",
                    holdings=self.store.holdings(),
                ),
            )
        elif isinstance(msg, MeasureLink) and msg.source == self.device_id:
            threading.Thread(target=self._probe, args=(run.run_id, msg.target), daemon=True).start()
        elif isinstance(msg, Stop):
            self._end_run(run)

    def _set_compression(self, run: _Run, msg: SetCompression) -> None:
        if msg.plan_id != run.plan_id:
            if msg.plan_id > run.plan_id and run.switch is None:
                # The central node moved on to a plan without this device (it took it for dead).
                log.warning(
                    "%s: the run went on to plan %d without this device; leaving run %s",
                    self.device_id,
                    msg.plan_id,
                    run.run_id,
                )
                self._end_run(run, rejoin=True)
            return
        if len(msg.forward) != run.num_stages:
            self._report_error(
                "command", f"compression for {len(msg.forward)} stages, the run has {run.num_stages}"
            )
            return
        run.run_bits = msg.forward[run.index]
        run.codecs.set_bits(self._forward_bits(run.run_bits), msg.backward[run.index])

    def _end_run(self, run: _Run, *, rejoin: bool = False) -> None:
        """The run is over (its ``stop``, or the central node gone idle) or went on without this device
        (``rejoin``: announce as idle, so that it can join again at the next re-split): final figures,
        then leave."""
        t = self.times.summary()
        log.info(
            "%s: run %s finished after %d batches here; of %.1f s: compute %.1f, communication %.1f, "
            "idle %.1f",
            self.device_id,
            run.run_id,
            run.batches,
            t["wall"],
            t["compute"],
            t["communication"],
            t["idle"],
        )
        self.publish_metrics()  # the final figures of this run
        self.report_drops()
        self._leave_run()
        if rejoin:
            self.announce()
        elif self.config.once:
            self._stopping = True

    def _probe(self, run_id: str, target: str) -> None:
        try:
            bandwidth, latency = self.probes.measure(target)
        except EdgeAgentError as exc:
            self._report_error("probe", str(exc), run_id)
            return
        log.info("%s -> %s: %.1f MB/s, %.2f ms", self.device_id, target, bandwidth / 1e6, latency * 1e3)
        self.send(
            self.topics.device(Family.REPLY, self.device_id),
            LinkReport(
                run_id=run_id, source=self.device_id, target=target, bandwidth=bandwidth, latency=latency
            ),
        )

    def _send_weights(self, run: _Run, *, purpose: str) -> None:
        stage = run.stage
        self.send(
            self.topics.device(Family.REPLY, self.device_id),
            Weights(
                run_id=run.run_id,
                device_id=self.device_id,
                stage=run.index,
                start=stage.module.start,
                end=stage.module.end,
                version=stage.version,
                tensors=stage.state(),
                purpose=purpose,
            ),
        )

    def _report_error(self, code: str, reason: str, run_id: str = "") -> None:
        """Tell the central node, at most a few times per 10 s: bad input must not turn into a flood."""
        now = time.monotonic()
        if now - self._error_window[0] > 10.0:
            self._error_window = (now, 0)
        if self._error_window[1] >= _ERROR_REPORTS_PER_10S:
            log.warning("%s: %s (not reported: too many error reports)", self.device_id, reason)
            return
        self._error_window = (self._error_window[0], self._error_window[1] + 1)
        self.send(
            self.topics.device(Family.REPLY, self.device_id),
            ErrorReport(device_id=self.device_id, code=code, reason=reason, run_id=run_id),
        )

    # -- compute -------------------------------------------------------------------------------

    def _forward(self, run: _Run, msg: Activation) -> None:
        run.next_forward = msg.batch_id + 1
        run.batch_size = int(msg.y.shape[0])
        run.last = "F"
        started = Clock()
        runner = run.runner
        out, version = runner.stage.forward(msg.batch_id, msg.x, msg.version)
        if run.is_last:
            self._fault_injection(msg.batch_id)
            result = runner.stage.backward(msg.batch_id, labels=msg.y)
            run.next_backward = msg.batch_id + 1
            runner.add_compute(emulate_slowdown(started, self.slowdown, self.times))
            self._batch_done(run, msg.batch_id)
            self._send_gradient(run, msg.batch_id, result.grad_input, result.loss, result.correct, [])
            return
        runner.add_compute(emulate_slowdown(started, self.slowdown, self.times))
        activation = runner.activation(
            out,
            msg.y,
            run_id=msg.run_id,
            plan_id=msg.plan_id,
            batch_id=msg.batch_id,
            version=version,
            mode="train",
            epoch=msg.batch_id // max(1, run.batches_per_epoch),
        )
        run.codecs.message_sent(self.send(self.topics.activations(run.index), activation))

    def _backward(self, run: _Run, msg: Gradient) -> None:
        run.next_backward = msg.batch_id + 1
        run.runner.gradient_arrived(msg.batch_id)
        run.last = "B"
        self._fault_injection(msg.batch_id)
        started = Clock()
        result = run.stage.backward(msg.batch_id, grad_output=msg.g)
        run.runner.add_compute(emulate_slowdown(started, self.slowdown, self.times))
        self._batch_done(run, msg.batch_id)
        self._send_gradient(run, msg.batch_id, result.grad_input, msg.loss, msg.correct, msg.stage_times)

    def _metrics(self) -> dict[str, Any] | None:
        """What this device publishes on its metrics topic (docs/protocol.md)."""
        run = self.run_state
        if run is None:
            return None
        t = self.times.summary()
        return {
            "stage": run.index,
            "batches": run.batches,
            "samples_per_second": run.samples / t["wall"] if t["wall"] > 0 else 0.0,
            "compute_s": round(t["compute"], 3),
            "communication_s": round(t["communication"], 3),
            "idle_s": round(t["idle"], 3),
            "wall_s": round(t["wall"], 3),
            "compression_ratio": round(run.codecs.ratio, 3),
            "slowdown": self.slowdown,
            "link_mbps": self.link_mbps,
            "profile": self.profile.digest() if self.profile else "",
            "layers": [run.points[run.index], run.points[run.index + 1]],
        }

    def _fault_injection(self, batch_id: int) -> None:
        if self.config.die_at_backward == batch_id:
            self._die(f"at the backward pass of batch {batch_id}")

    def _die(self, where: str) -> None:
        """SIGKILL this process (fault injection). What it sent before is delivered first, so that a
        fault "at batch N" is one at batch N and not, by a race with the network thread, one before."""
        log.warning("%s: fault injection: SIGKILL %s", self.device_id, where)
        self.transport.flush(5.0)
        os.kill(os.getpid(), signal.SIGKILL)

    def _batch_done(self, run: _Run, batch_id: int) -> None:
        """A batch's forward and backward are both done here: record its time; replicate at the points."""
        run.batches += 1
        run.samples += run.batch_size
        run.runner.batch_done()
        done = batch_id + 1
        chain = run.chain_every > 0 and done % run.chain_every == 0
        full = run.global_every > 0 and done % run.global_every == 0
        if not (chain or full):
            return
        # Snapshot now, on the training thread (a consistent version); encode and send on the
        # scheduler's thread so that training goes on meanwhile (Sec. III-E).
        snap = self.store.snapshot(run.stage)
        messages = []
        if chain:
            msg = replica_message(run.run_id, self.device_id, run.index, snap, "chain", run.plan_id)
            messages.append((self.topics.device(Family.REPLICA, self.device_id), msg))
        if full:
            msg = replica_message(run.run_id, self.device_id, run.index, snap, "global", run.plan_id)
            messages.append((self.topics.device(Family.REPLY, self.device_id), msg))
        for topic, msg in messages:
            self.run_soon(self.send, topic, msg)

    def _replicate_now(self, run: _Run) -> None:
        """After a new split: snapshots of the old layout cannot restore this one, so start afresh with
        a snapshot of the new stage and send its chain and global replicas before saying "built"
        (the global one shares the reply topic with "built", so the central node has it first)."""
        self.store.clear()
        snap = self.store.snapshot(run.stage)
        if run.chain_every > 0:
            msg = replica_message(run.run_id, self.device_id, run.index, snap, "chain", run.plan_id)
            self.send(self.topics.device(Family.REPLICA, self.device_id), msg)
        if run.global_every > 0:
            msg = replica_message(run.run_id, self.device_id, run.index, snap, "global", run.plan_id)
            self.send(self.topics.device(Family.REPLY, self.device_id), msg)

    def _send_gradient(
        self,
        run: _Run,
        batch_id: int,
        grad: torch.Tensor | None,
        loss: float,
        correct: int,
        downstream: list[float],
    ) -> None:
        if grad is None:
            raise TrainingError(f"stage {run.index} produced no input gradient for batch {batch_id}")
        # The average time per batch rides with the gradients to the central node (Sec. III-D).
        gradient = run.runner.gradient(
            grad,
            run_id=run.run_id,
            plan_id=run.plan_id,
            batch_id=batch_id,
            loss=loss,
            correct=correct,
            downstream=downstream,
        )
        run.codecs.message_sent(self.send(self.topics.gradients(run.index), gradient))

    def _evaluate(self, run: _Run, msg: Activation) -> None:
        self._eval_batches += 1
        if self.config.die_at_eval == self._eval_batches:
            self._die(f"at evaluation batch {self._eval_batches} (id {msg.batch_id})")
        started = Clock()
        out = run.stage.evaluate(msg.x)
        emulate_slowdown(started, self.slowdown, self.times)
        if run.is_last:
            loss_sum = float(torch.nn.functional.cross_entropy(out, msg.y, reduction="sum"))
            correct = int((out.argmax(dim=1) == msg.y).sum())
            self.send(
                self.topics.results(run.index),
                EvalResult(
                    run_id=msg.run_id,
                    plan_id=msg.plan_id,
                    batch_id=msg.batch_id,
                    correct=correct,
                    count=int(msg.y.shape[0]),
                    loss_sum=loss_sum,
                ),
            )
        else:
            activation = run.runner.activation(
                out,
                msg.y,
                run_id=msg.run_id,
                plan_id=msg.plan_id,
                batch_id=msg.batch_id,
                version=msg.version,
                mode="eval",
                epoch=0,
            )
            run.codecs.message_sent(self.send(self.topics.activations(run.index), activation))


__all__ = ["Worker"]
