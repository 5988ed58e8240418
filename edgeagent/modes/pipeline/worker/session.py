"""The pipeline mode's half of a run on a worker: one stage of FTPipeHD's pipeline (papers/000).

A :class:`PipelineSession` lives from the ``Assign`` that gives this device a stage until the run ends
or goes on without it. It takes activations and gradients through the stage's
:class:`~edgeagent.pipeline.runner.StageRunner`, runs forward, backward and evaluation passes in 1F1B
order, replicates the stage's weights (Sec. III-E), moves layers when the central node re-splits the
model (Sec. III-D) and answers the run's commands. The device itself (lifecycle, profile, error budget,
fault injection, the loop) is the :class:`~edgeagent.roles.worker.node.Worker`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from edgeagent.compression.stage import NONE
from edgeagent.errors import EdgeAgentError, TrainingError
from edgeagent.models import ModelSpec
from edgeagent.modes.pipeline.worker.replicas import Replicas
from edgeagent.modes.pipeline.worker.run import Run, stage_input
from edgeagent.pipeline.build import build_stage
from edgeagent.pipeline.divergence import loss_not_finite
from edgeagent.pipeline.runner import StageRunner
from edgeagent.protocol.commands import Collect, Command, MeasureLink, Ping, SetCompression, Stop
from edgeagent.protocol.identity import PlanView
from edgeagent.protocol.messages import (
    Activation,
    Assign,
    Commit,
    FetchRequest,
    Gradient,
    Message,
    Ready,
    ReadyPhase,
    Repartition,
    Status,
    Weights,
)
from edgeagent.protocol.topics import Family
from edgeagent.replication.switch import Switch
from edgeagent.runtime.compute import Clock, emulate_slowdown
from edgeagent.runtime.role import Handler, Inbound

if TYPE_CHECKING:
    from edgeagent.roles.worker.node import Worker

log = logging.getLogger(__name__)

C = TypeVar("C", bound=Command)


class PipelineSession:
    """One stage of a pipeline run on a worker (see the module doc); ``run`` is its state."""

    def __init__(self, worker: Worker, run: Run) -> None:
        self.worker = worker
        self.run = run
        self.run_id = run.run_id
        self.replicas = Replicas(worker, run)  # this run's snapshots and the replicas held here

    # -- set-up and tear-down ------------------------------------------------------------------

    @classmethod
    def open(cls, worker: Worker, msg: Assign) -> PipelineSession | None:
        """Build the stage ``msg`` assigns this device and start the session; None (after reporting
        why) when this device is not in the run or the stage cannot be built. A re-assignment of the
        run the worker is in replaces it only once the new stage is built."""
        run = cls._build(worker, msg)
        if run is None:
            return None
        worker.leave_run()
        session = cls(worker, run)
        session._start(msg)
        return session

    @classmethod
    def _stage_index(cls, worker: Worker, msg: Assign) -> int | None:
        """The stage ``msg`` gives this device, or None if it gives it none."""
        return msg.worker_list.index(worker.device_id) if worker.device_id in msg.worker_list else None

    @classmethod
    def _replicated(cls, worker: Worker, msg: Assign, index: int) -> bool:
        """Whether stage ``index`` is held by several devices (a hybrid run's replicated stage)."""
        return bool(msg.groups) and len(msg.groups[index]) > 1

    @classmethod
    def _build(cls, worker: Worker, msg: Assign) -> Run | None:
        index = cls._stage_index(worker, msg)
        if index is None:
            worker.report_error("assign", f"not in the worker list {msg.worker_list}", msg.run_id)
            return None
        options = msg.options
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
                in_flight=msg.in_flight,
                replicated=cls._replicated(worker, msg, index),
            )
        except (ValueError, EdgeAgentError) as exc:
            worker.report_error("assign", f"cannot build stage {index}: {exc}", msg.run_id)
            return None
        start_id = options.first_item(msg.committed_backward_id + 1)
        return Run(
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

    def _start(self, msg: Assign) -> None:
        run, worker = self.run, self.worker
        worker.set_metrics_interval(msg.metrics_interval)
        # The central node's retained status: "idle" means its run is over, even if our "stop" was lost.
        worker.listen(worker.topics.device(Family.STATUS, run.worker_list[0]))
        self._subscribe_stage()
        worker.times.reset()
        worker.set_status("training", run_id=msg.run_id, stage=run.index)
        log.info(
            "%s: stage %d of %d, layers [%d, %d), %d parameters",
            worker.device_id,
            run.index,
            run.num_stages,
            run.points[run.index],
            run.points[run.index + 1],
            sum(p.numel() for p in run.stage.module.parameters()),
        )
        if msg.status == 0 and (msg.weights is not None or run.next_forward > 0):
            # The run starts from given weights (--resume, --init-weights): replicate them before
            # "built", so that a rollback never goes past them to the seeded model (Sec. III-E).
            self.replicas.replicate_now()
        self._say_ready("built")

    def _stage_subscriptions(self) -> list[str]:
        """The stage's inputs (activations of the stage before, gradients of the stage after) and the
        chain replicas it holds."""
        run, topics = self.run, self.worker.topics
        wanted = [topics.stage_filter(Family.ACTIVATIONS, run.index - 1)]
        if not run.is_last:
            wanted.append(topics.stage_filter(Family.GRADIENTS, run.index + 1))
        # Chain replicas of the ``replicas`` stages before this one, wrapping around after the last stage
        # as planner.recovery.holders_of does (never of the central node's stage 0, which keeps its own).
        n = len(run.worker_list)
        for k in range(1, min(run.replicas, n - 1) + 1):
            source = (run.index - k) % n
            if source >= 1:
                wanted.append(topics.device(Family.REPLICA, run.worker_list[source]))
        return wanted

    def _subscribe_stage(self) -> None:
        """Listen to what :meth:`_stage_subscriptions` names; echo the predecessor's link probes. Only what
        changed is unsubscribed: a message published meanwhile on a topic the stage keeps is not lost (a
        hybrid stage's failover changes the subscriptions while batches are in flight)."""
        run, worker = self.run, self.worker
        run.sample = stage_input(run.spec, run.points[run.index], run.layer_shapes, run.layer_dtypes)
        before, run.subscriptions = run.subscriptions, self._stage_subscriptions()
        for pattern in before:
            if pattern not in run.subscriptions:
                worker.stop_listening(pattern)
        for pattern in run.subscriptions:
            if pattern not in before:
                worker.listen(pattern)
        worker.probes.unwatch_all()
        worker.probes.watch(run.worker_list[run.index - 1])  # echo the predecessor's bandwidth probes

    def close(self) -> None:
        """Unsubscribe from the stage's topics and the central node's status; stop echoing probes."""
        worker = self.worker
        for pattern in self.run.subscriptions:
            worker.stop_listening(pattern)
        worker.stop_listening(worker.topics.device(Family.STATUS, self.run.worker_list[0]))
        worker.probes.unwatch_all()

    def _end(self, *, rejoin: bool = False) -> None:
        """The run is over here (see :meth:`Worker.end_run`): its figures in the log, then leave."""
        t = self.worker.times.summary()
        log.info(
            "%s: run %s finished after %d batches here; of %.1f s: compute %.1f, communication %.1f, "
            "idle %.1f",
            self.worker.device_id,
            self.run.run_id,
            self.run.batches,
            t["wall"],
            t["compute"],
            t["communication"],
            t["idle"],
        )
        self.worker.end_run(rejoin=rejoin)

    # -- the session's interface (modes.base.WorkerSession) ------------------------------------

    def plan_view(self) -> PlanView:
        """Who holds each stage now: the worker takes stage outputs only from them (protocol/identity.py)."""
        return PlanView(self.run.run_id, self.run.plan_id, [[d] for d in self.run.worker_list])

    def handlers(self) -> dict[type[Message], Handler]:
        return {
            Activation: self._on_activation,
            Gradient: self._on_gradient,
            Repartition: self._on_repartition,
            FetchRequest: self._on_fetch,
            Weights: self._on_weights,
            Commit: self._on_commit,
            Status: self._on_status,
            Stop: self._on_stop,
            Collect: self._on_collect,
            SetCompression: self._on_set_compression,
            Ping: self._on_ping,
            MeasureLink: self._on_measure_link,
        }

    def has_work(self) -> bool:
        return self.run.ready() is not None or bool(self.run.evals)

    def step(self) -> None:
        """An evaluation batch first (the central node waits for its results), else 1F1B's next pass."""
        run = self.run
        if run.evals:
            self._evaluate(run.evals.pop(0))
            return
        kind = run.ready()
        if kind == "F":
            self._forward(run.forwards.pop(run.next_forward))
        elif kind == "B":
            self._backward(run.backwards.pop(run.next_backward))

    def metrics(self) -> dict[str, Any]:
        run, worker = self.run, self.worker
        t = worker.times.summary()
        return {
            "stage": run.index,
            "batches": run.batches,
            "samples_per_second": run.samples / t["wall"] if t["wall"] > 0 else 0.0,
            "compute_s": round(t["compute"], 3),
            "communication_s": round(t["communication"], 3),
            "idle_s": round(t["idle"], 3),
            "wall_s": round(t["wall"], 3),
            "compression_ratio": round(run.codecs.ratio, 3),
            "slowdown": worker.slowdown,
            "link_mbps": worker.link_mbps,
            "profile": worker.profile.digest() if worker.profile else "",
            "layers": [run.points[run.index], run.points[run.index + 1]],
        }

    def profile_changed(self) -> None:
        """A profile may override the bits of this device's outgoing activations."""
        codecs = self.run.codecs
        codecs.set_bits(self._forward_bits(self.run.run_bits), codecs.backward_bits)

    def _forward_bits(self, run_choice: int) -> int:
        """The bits of this device's outgoing activations: its profile's override, or the run's."""
        profile = self.worker.profile
        override = profile.compression if profile else "run"
        if override == "run":
            return run_choice
        return NONE if override == "none" else int(override)

    # -- intake: the stage's inputs and the central node's status ------------------------------

    def _on_activation(self, item: Inbound) -> None:
        msg, run = item.message, self.run
        assert isinstance(msg, Activation)
        if not run.matches(msg.run_id, msg.plan_id):
            return  # a stale batch from an earlier run or plan
        if msg.mode == "train" and msg.batch_id < run.next_forward:
            return  # a duplicate delivery (QoS 1)
        problem = run.activation_problem(msg)
        taken: Activation | None = None
        if problem is not None:
            problem = f"activation of batch {msg.batch_id}: {problem}"
        else:
            taken, problem = run.runner.take_activation(
                msg, sample=run.sample, num_classes=run.spec.num_classes
            )
        if taken is None:
            self.worker.discard(item, problem or "")
        elif taken.mode == "eval":
            run.evals.append(taken)
        else:
            run.forwards[taken.batch_id] = taken

    def _on_gradient(self, item: Inbound) -> None:
        msg, run = item.message, self.run
        assert isinstance(msg, Gradient)
        if not run.matches(msg.run_id, msg.plan_id) or msg.batch_id < run.next_backward:
            return
        grad, problem = run.runner.take_gradient(msg)
        if grad is None:
            self.worker.discard(item, problem or "")
            return
        run.backwards[grad.batch_id] = grad

    def _on_status(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, Status)
        verdict = self.worker.central_status(msg, self.run.worker_list[0], self.run.run_id)
        if verdict is not None:
            self._end(rejoin=verdict.action == "leave")

    # -- re-partition (Sec. III-D) -------------------------------------------------------------

    def _on_repartition(self, item: Inbound) -> None:
        msg, run, worker = item.message, self.run, self.worker
        assert isinstance(msg, Repartition)
        if msg.run_id != run.run_id or msg.plan_id <= run.plan_id:
            return
        try:
            switch = Switch.start(worker.device_id, msg, self.replicas.store, run.stage, run.spec, run.seed)
        except (TrainingError, ValueError) as exc:
            worker.report_error("repartition", f"plan {msg.plan_id}: {exc}", run.run_id)
            return
        if switch is None:
            log.info("%s: no stage in plan %d; leaving the run", worker.device_id, msg.plan_id)
            worker.leave_run()
            return
        run.switch = switch
        for holder in switch.holders:
            worker.listen(worker.topics.device(Family.REPLICA, holder))
        for request in switch.requests():
            worker.send(worker.topics.device(Family.REQUEST, worker.device_id), request)
        log.info(
            "%s: plan %d, layers [%d, %d): keeping %s, fetching %s",
            worker.device_id,
            msg.plan_id,
            switch.plan.start,
            switch.plan.end,
            list(switch.plan.local),
            {k: list(v) for k, v in switch.plan.fetch.items()},
        )
        self._maybe_fetched()

    def _on_fetch(self, item: Inbound) -> None:
        """Another device moves layers this one holds (live, a snapshot or a replica): send them."""
        msg = item.message
        assert isinstance(msg, FetchRequest)
        if msg.owner == self.worker.device_id and msg.run_id == self.run.run_id:
            self.replicas.serve(msg)

    def _on_weights(self, item: Inbound) -> None:
        """A chain replica of a stage before this one, or layers fetched for a re-partition."""
        msg, run = item.message, self.run
        assert isinstance(msg, Weights)
        if msg.run_id != run.run_id:
            return
        if msg.purpose == "chain" and msg.plan_id == run.plan_id:
            self.replicas.store.add_replica(msg)
        elif msg.purpose == "redistribute" and run.switch is not None and run.switch.accept(msg):
            self._maybe_fetched()

    def _maybe_fetched(self) -> None:
        if self.run.switch is not None and self.run.switch.complete:
            self._say_ready("fetched")

    def _on_commit(self, item: Inbound) -> None:
        """Every device of the new plan has its layers: build the new stage and go on from there."""
        msg, run, worker = item.message, self.run, self.worker
        assert isinstance(msg, Commit)
        switch = run.switch if msg.run_id == run.run_id else None
        if switch is None or msg.plan_id != switch.plan_id:
            return
        stage = switch.build(run.spec, run.seed, run.options)
        for holder in switch.plan.fetch:
            topic = worker.topics.device(Family.REPLICA, holder)
            if topic not in run.subscriptions:  # a stage's own subscription follows _subscribe_stage
                worker.stop_listening(topic)
        run.adopt(switch, stage)
        self._subscribe_stage()
        self.replicas.replicate_now()
        worker.set_status("training", run_id=run.run_id, stage=run.index)
        self._say_ready("built")

    def _say_ready(self, phase: ReadyPhase) -> None:
        run, worker = self.run, self.worker
        worker.send(
            worker.topics.device(Family.REPLY, worker.device_id),
            Ready(
                run_id=run.run_id,
                plan_id=run.switch.plan_id if run.switch else run.plan_id,
                device_id=worker.device_id,
                stage=run.index,
                parameters=sum(p.numel() for p in run.stage.module.parameters()),
                phase=phase,
            ),
        )

    # -- the run's commands --------------------------------------------------------------------

    def _command(self, item: Inbound, kind: type[C]) -> C | None:
        """``item``'s command if it belongs to this run: another run's (or a forged one's) is not ours."""
        msg = item.message
        return msg if isinstance(msg, kind) and msg.run_id == self.run.run_id else None

    def _on_stop(self, item: Inbound) -> None:
        if self._command(item, Stop) is not None:
            self._end()

    def _on_collect(self, item: Inbound) -> None:
        """Send the stage's weights to the central node (the trained model)."""
        if self._command(item, Collect) is None:
            return
        run, worker, stage = self.run, self.worker, self.run.stage
        module = stage.module
        weights = Weights(
            run_id=run.run_id, device_id=worker.device_id, stage=run.index, start=module.start,
            end=module.end, version=stage.version, tensors=stage.state(), purpose="collect",
        )  # fmt: skip
        worker.send(worker.topics.device(Family.REPLY, worker.device_id), weights)

    def _on_ping(self, item: Inbound) -> None:
        """Say this device is alive, and which weight versions it holds (a recovery's probe)."""
        if self._command(item, Ping) is None:
            return
        run, worker = self.run, self.worker
        worker.send(
            worker.topics.device(Family.REPLY, worker.device_id),
            Ready(
                run_id=run.run_id,
                plan_id=run.plan_id,
                device_id=worker.device_id,
                stage=run.index,
                parameters=0,
                phase="alive",
                holdings=self.replicas.store.holdings(),
            ),
        )

    def _on_measure_link(self, item: Inbound) -> None:
        msg = self._command(item, MeasureLink)
        if msg is not None and msg.source == self.worker.device_id:
            self.worker.measure_link(self.run.run_id, msg.target)

    def _on_set_compression(self, item: Inbound) -> None:
        msg, run = self._command(item, SetCompression), self.run
        if msg is None:
            return
        if msg.plan_id != run.plan_id:
            if msg.plan_id > run.plan_id and run.switch is None:
                # The central node moved on to a plan without this device (it took it for dead).
                log.warning(
                    "%s: the run went on to plan %d without this device; leaving run %s",
                    self.worker.device_id,
                    msg.plan_id,
                    run.run_id,
                )
                self._end(rejoin=True)
            return
        if len(msg.forward) != run.num_stages:
            self.worker.report_error(
                "command", f"compression for {len(msg.forward)} stages, the run has {run.num_stages}"
            )
            return
        run.run_bits = msg.forward[run.index]
        run.codecs.set_bits(self._forward_bits(run.run_bits), msg.backward[run.index])

    # -- compute -------------------------------------------------------------------------------

    def _forward(self, msg: Activation) -> None:
        run, worker = self.run, self.worker
        run.next_forward = msg.batch_id + 1
        run.batch_size = int(msg.y.shape[0])
        run.last = "F"
        started = Clock()
        runner = run.runner
        out, version = runner.stage.forward(msg.batch_id, msg.tensor, msg.version)
        if run.is_last:
            worker.fault_at_backward(run.options.batch_of(msg.batch_id))
            # The sync schedule's micro-batch: its loss over the whole batch's rows (Activation.total).
            result = runner.stage.backward(msg.batch_id, labels=msg.y, total=msg.total)
            run.next_backward = msg.batch_id + 1
            if not math.isfinite(result.loss):
                self._diverged(msg.batch_id, result.loss)
                return
            runner.add_compute(emulate_slowdown(started, worker.slowdown, worker.times))
            self._batch_done(msg.batch_id)
            self._send_gradient(msg.batch_id, result.grad_input, result.loss, result.correct, [])
            return
        runner.add_compute(emulate_slowdown(started, worker.slowdown, worker.times))
        activation = runner.activation(
            worker.poisoned("activation", run.options.batch_of(msg.batch_id), out),
            msg.y,
            run_id=msg.run_id,
            plan_id=msg.plan_id,
            batch_id=msg.batch_id,
            version=version,
            mode="train",
            epoch=run.options.batch_of(msg.batch_id) // max(1, run.batches_per_epoch),
        )
        if msg.rows:  # a micro-batch of the sync schedule: its rows of the batch go on with it
            activation = dataclasses.replace(activation, rows=msg.rows, total=msg.total)
        run.codecs.message_sent(
            worker.send(worker.topics.activations(run.index, worker.device_id), activation)
        )

    def _backward(self, msg: Gradient) -> None:
        run, worker = self.run, self.worker
        run.next_backward = msg.batch_id + 1
        run.runner.gradient_arrived(msg.batch_id)
        run.last = "B"
        worker.fault_at_backward(run.options.batch_of(msg.batch_id))
        started = Clock()
        result = run.stage.backward(msg.batch_id, grad_output=msg.tensor)
        run.runner.add_compute(emulate_slowdown(started, worker.slowdown, worker.times))
        self._batch_done(msg.batch_id)
        self._send_gradient(msg.batch_id, result.grad_input, msg.loss, msg.correct, msg.stage_times)

    def _diverged(self, item: int, loss: float) -> None:
        """The loss is not finite: nothing downstream can use this batch; the central node ends the run."""
        run = self.run
        reason = loss_not_finite(run.options.batch_of(item), loss, run.options.learning_rate)
        log.error("%s: %s", self.worker.device_id, reason)
        self.worker.report_error("diverged", reason, run.run_id)

    def _send_gradient(
        self, batch_id: int, grad: torch.Tensor | None, loss: float, correct: int, downstream: list[float]
    ) -> None:
        run, worker = self.run, self.worker
        if grad is None:
            raise TrainingError(f"stage {run.index} produced no input gradient for batch {batch_id}")
        # The average time per batch rides with the gradients to the central node (Sec. III-D).
        gradient = run.runner.gradient(
            worker.poisoned("gradient", run.options.batch_of(batch_id), grad),
            run_id=run.run_id,
            plan_id=run.plan_id,
            batch_id=batch_id,
            loss=loss,
            correct=correct,
            downstream=downstream,
        )
        run.codecs.message_sent(worker.send(worker.topics.gradients(run.index, worker.device_id), gradient))

    def _evaluate(self, msg: Activation) -> None:
        run, worker = self.run, self.worker
        worker.fault_at_evaluation(msg.batch_id)
        started = Clock()
        out = run.stage.evaluate(msg.tensor)
        emulate_slowdown(started, worker.slowdown, worker.times)
        if not run.is_last:
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
            run.codecs.message_sent(
                worker.send(worker.topics.activations(run.index, worker.device_id), activation)
            )
            return
        result = run.runner.result(out, msg.y, run_id=msg.run_id, plan_id=msg.plan_id, batch_id=msg.batch_id)
        worker.send(worker.topics.results(run.index, worker.device_id), result)

    def _batch_done(self, item: int) -> None:
        """A batch's forward and backward are both done here: record its time; replicate at the points.
        Under the sync schedule ``item`` is a micro-batch: the batch is done at its last one."""
        run = self.run
        run.samples += run.batch_size
        options = run.options
        if options.micro_batches and (item + 1) % options.micro_batches:
            return
        run.batches += 1
        run.runner.batch_done()
        self.replicas.batch_done(options.batch_of(item))


__all__ = ["PipelineSession"]
