"""The worker: runs one pipeline stage, as the central node assigns it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from edgeagent import __version__
from edgeagent.config import WorkerConfig
from edgeagent.errors import EdgeAgentError, TrainingError
from edgeagent.models import ModelSpec, build_layers
from edgeagent.pipeline.schedule import Kind, next_kind
from edgeagent.pipeline.stage import Stage, StageModule, StageOptions
from edgeagent.protocol.messages import (
    Activation,
    Announce,
    Assign,
    Command,
    Discover,
    ErrorReport,
    EvalResult,
    Gradient,
    Ready,
    Weights,
)
from edgeagent.protocol.topics import Family, Topics
from edgeagent.roles.base import Clock, Inbound, Role, configure_threads, emulate_slowdown
from edgeagent.transport.base import Transport
from edgeagent.transport.mqtt import MqttTransport

log = logging.getLogger(__name__)


@dataclass
class _Run:
    """What a worker knows about the run it is in."""

    assign: Assign
    index: int
    stage: Stage
    subscriptions: list[str]
    forwards: dict[int, Activation] = field(default_factory=dict)
    backwards: dict[int, Gradient] = field(default_factory=dict)
    evals: list[Activation] = field(default_factory=list)
    next_forward: int = 0
    next_backward: int = 0
    last: Kind | None = None
    batches: int = 0

    @property
    def num_stages(self) -> int:
        return len(self.assign.points) - 1

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1


class Worker(Role):
    def __init__(self, config: WorkerConfig, transport: Transport | None = None) -> None:
        topics = Topics(config.cluster)
        self.config = config
        self.slowdown = config.slowdown
        self._owns_transport = transport is None
        if transport is None:
            will = Role.offline_will_for(topics, config.device_id)
            transport = MqttTransport(config.broker, f"ea-{config.cluster}-{config.device_id}", will=will)
        super().__init__(transport, topics, config.device_id)
        self.run_state: _Run | None = None
        self.completed_runs = 0
        self._stopping = False

    # -- lifecycle -----------------------------------------------------------------------------

    def serve(self) -> int:
        """Serve runs until stopped (or after one run with ``once``). Returns a process exit code."""
        configure_threads(self.config.threads)
        self.listen(self.topics.fixed(Family.DISCOVER))
        self.listen(self.topics.fixed(Family.COMMAND))
        self.listen(self.topics.device(Family.CONTROL, self.device_id))
        if not self.transport.wait_connected(30):
            log.warning("%s: broker not reachable yet; still trying", self.device_id)
        self.set_status("idle")
        self.start_heartbeats(self.config.heartbeat_interval)
        self.announce()
        try:
            while not self._stopping:
                self._step()
        finally:
            self.stop_heartbeats()
            if self._owns_transport:
                self.transport.close()
        return 0

    def stop(self) -> None:
        self._stopping = True

    def announce(self) -> None:
        busy = self.run_state.assign.run_id if self.run_state else ""
        self.send(
            self.topics.fixed(Family.ANNOUNCE),
            Announce(
                device_id=self.device_id,
                busy_with=busy,
                threads=self.config.threads,
                slowdown=self.slowdown,
                software=__version__,
            ),
        )

    # -- the loop ------------------------------------------------------------------------------

    def _step(self) -> None:
        run = self.run_state
        work = run is not None and (self._ready(run) is not None or bool(run.evals))
        item = self.next_message(0 if work else 0.5)
        while item is not None:
            self._handle(item)
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

    def _ready(self, run: _Run) -> Kind | None:
        fwd = run.next_forward in run.forwards
        bwd = (not run.is_last) and run.next_backward in run.backwards
        return next_kind(run.last, fwd, bwd)

    def _handle(self, item: Inbound) -> None:
        msg = item.message
        run = self.run_state
        if isinstance(msg, Activation):
            if run is None or msg.run_id != run.assign.run_id or msg.plan_id != run.assign.plan_id:
                return  # a stale batch from an earlier run or plan
            if msg.stage != run.index - 1:
                log.warning(
                    "%s: activation from stage %d, expected %d; dropped",
                    self.device_id,
                    msg.stage,
                    run.index - 1,
                )
            elif msg.mode == "eval":
                run.evals.append(msg)
            elif msg.batch_id >= run.next_forward:  # below: a duplicate delivery (QoS 1)
                run.forwards[msg.batch_id] = msg
        elif isinstance(msg, Gradient):
            if run is None or msg.run_id != run.assign.run_id or msg.plan_id != run.assign.plan_id:
                return
            if msg.batch_id >= run.next_backward:
                run.backwards[msg.batch_id] = msg
        elif isinstance(msg, Assign):
            self._assign(msg)
        elif isinstance(msg, Command):
            self._command(msg)
        elif isinstance(msg, Discover):
            self.announce()
        else:
            log.debug("%s ignores %s on %s", self.device_id, msg.KIND.value, item.topic.family.value)

    # -- set-up --------------------------------------------------------------------------------

    def _assign(self, msg: Assign) -> None:
        if self.run_state is not None and self.run_state.assign.run_id != msg.run_id:
            self._report_error("busy", f"already training run {self.run_state.assign.run_id}", msg.run_id)
            return
        if self.device_id not in msg.worker_list:
            self._report_error("assign", f"not in the worker list {msg.worker_list}", msg.run_id)
            return
        index = msg.worker_list.index(self.device_id)
        try:
            spec = ModelSpec.from_dict(msg.model)
            start, end = msg.points[index], msg.points[index + 1]
            layers = build_layers(spec, start, end, seed=msg.seed)
            module = StageModule({start + k: layer for k, layer in enumerate(layers)})
            if msg.weights:
                missing, _unexpected = module.load_state_dict(msg.weights, strict=False)
                if missing:
                    raise TrainingError(f"assignment lacks weights for {missing[:5]}")
        except (ValueError, EdgeAgentError, RuntimeError) as exc:
            self._report_error("assign", f"cannot build stage {index}: {exc}", msg.run_id)
            return
        num_stages = len(msg.points) - 1
        options = StageOptions(
            learning_rate=msg.learning_rate,
            momentum=msg.momentum,
            weight_decay=msg.weight_decay,
            aggregation=msg.aggregation,
            aggregation_window=num_stages - index,
            aggregation_interval=msg.aggregation_interval,
        )
        stage = Stage(module, options, is_first=False, is_last=index == num_stages - 1)
        if self.run_state is not None:
            self._leave_run()
        subs = [self.topics.activations(index - 1)]
        if index < num_stages - 1:
            subs.append(self.topics.gradients(index + 1))
        for pattern in subs:
            self.listen(pattern)
        start_id = msg.committed_backward_id + 1
        self.run_state = _Run(msg, index, stage, subs, next_forward=start_id, next_backward=start_id)
        self.times.reset()
        self.set_status("training", run_id=msg.run_id, stage=index)
        n_params = sum(p.numel() for p in module.parameters())
        log.info(
            "%s: stage %d of %d, layers [%d, %d), %d parameters",
            self.device_id,
            index,
            num_stages,
            msg.points[index],
            msg.points[index + 1],
            n_params,
        )
        self.send(
            self.topics.device(Family.REPLY, self.device_id),
            Ready(
                run_id=msg.run_id,
                plan_id=msg.plan_id,
                device_id=self.device_id,
                stage=index,
                parameters=n_params,
            ),
        )

    def _leave_run(self) -> None:
        run = self.run_state
        if run is None:
            return
        for pattern in run.subscriptions:
            self.stop_listening(pattern)
        self.run_state = None
        self.completed_runs += 1
        self.set_status("idle")

    def _command(self, msg: Command) -> None:
        run = self.run_state
        if msg.name not in Command.COMMANDS:
            self._report_error(
                "command", f"unknown command {msg.name!r}; known: {Command.COMMANDS}", msg.run_id
            )
            return
        if run is None or msg.run_id != run.assign.run_id:
            return
        if msg.name == "collect":
            self._send_weights(run, purpose="collect")
        elif msg.name == "stop":
            t = self.times.summary()
            log.info(
                "%s: run %s finished after %d batches here; of %.1f s: compute %.1f, communication %.1f, "
                "idle %.1f",
                self.device_id,
                msg.run_id,
                run.batches,
                t["wall"],
                t["compute"],
                t["communication"],
                t["idle"],
            )
            self._leave_run()
            if self.config.once:
                self._stopping = True

    def _send_weights(self, run: _Run, *, purpose: str) -> None:
        stage = run.stage
        self.send(
            self.topics.device(Family.REPLY, self.device_id),
            Weights(
                run_id=run.assign.run_id,
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
        self.send(
            self.topics.device(Family.REPLY, self.device_id),
            ErrorReport(device_id=self.device_id, code=code, reason=reason, run_id=run_id),
        )

    # -- compute -------------------------------------------------------------------------------

    def _forward(self, run: _Run, msg: Activation) -> None:
        run.next_forward = msg.batch_id + 1
        run.last = "F"
        started = Clock()
        stage = run.stage
        out, version = stage.forward(msg.batch_id, msg.x, msg.version)
        if run.is_last:
            result = stage.backward(msg.batch_id, labels=msg.y)
            run.next_backward = msg.batch_id + 1
            run.batches += 1
            emulate_slowdown(started, self.slowdown, self.times)
            self._send_gradient(run, msg.batch_id, result.grad_input, result.loss, result.correct, [])
            return
        emulate_slowdown(started, self.slowdown, self.times)
        self.send(
            self.topics.activations(run.index),
            Activation(
                run_id=msg.run_id,
                plan_id=msg.plan_id,
                stage=run.index,
                batch_id=msg.batch_id,
                version=version,
                mode="train",
                x=out,
                y=msg.y,
            ),
        )

    def _backward(self, run: _Run, msg: Gradient) -> None:
        run.next_backward = msg.batch_id + 1
        run.last = "B"
        started = Clock()
        result = run.stage.backward(msg.batch_id, grad_output=msg.g)
        run.batches += 1
        emulate_slowdown(started, self.slowdown, self.times)
        self._send_gradient(run, msg.batch_id, result.grad_input, msg.loss, msg.correct, msg.stage_times)

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
        per_batch = run.stage.compute_seconds * self.slowdown / max(1, run.batches)
        self.send(
            self.topics.gradients(run.index),
            Gradient(
                run_id=run.assign.run_id,
                plan_id=run.assign.plan_id,
                stage=run.index,
                batch_id=batch_id,
                g=grad,
                loss=loss,
                correct=correct,
                stage_times=[per_batch, *downstream],
            ),
        )

    def _evaluate(self, run: _Run, msg: Activation) -> None:
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
            self.send(
                self.topics.activations(run.index),
                Activation(
                    run_id=msg.run_id,
                    plan_id=msg.plan_id,
                    stage=run.index,
                    batch_id=msg.batch_id,
                    version=msg.version,
                    mode="eval",
                    x=out,
                    y=msg.y,
                ),
            )
