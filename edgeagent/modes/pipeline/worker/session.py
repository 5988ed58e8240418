"""The pipeline mode's half of a run on a worker: one stage of FTPipeHD's pipeline (papers/000).

A :class:`PipelineSession` lives from the ``Assign`` that gives this device a stage until the run ends
or goes on without it. It takes activations and gradients through the stage's
:class:`~edgeagent.pipeline.runner.StageRunner`, runs forward, backward and evaluation passes in 1F1B
order (each step, its message and its fault hooks through a :class:`~edgeagent.pipeline.step.StageStep`),
replicates the stage's weights (Sec. III-E, :mod:`.replicas`), moves layers when the central node
re-splits the model (Sec. III-D, :mod:`.repartition`) and answers the run's commands (:mod:`.commands`):
collaborators it holds. The device itself (lifecycle, profile, error budget,
fault injection, the loop) is the :class:`~edgeagent.roles.worker.node.Worker`'s.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import torch

from edgeagent.errors import EdgeAgentError
from edgeagent.models import ModelSpec
from edgeagent.modes.pipeline.worker.commands import RunCommands
from edgeagent.modes.pipeline.worker.repartition import Repartitioning
from edgeagent.modes.pipeline.worker.replicas import Replicas
from edgeagent.modes.pipeline.worker.run import Run, stage_input
from edgeagent.pipeline.build import build_stage
from edgeagent.pipeline.divergence import loss_not_finite
from edgeagent.pipeline.runner import StageRunner, log_bound
from edgeagent.pipeline.step import StageStep
from edgeagent.protocol.identity import PlanView
from edgeagent.protocol.messages import Activation, Assign, Gradient, Message, Status
from edgeagent.protocol.topics import Family
from edgeagent.runtime.role import Handler, Inbound

if TYPE_CHECKING:
    from edgeagent.roles.worker.node import Worker

log = logging.getLogger(__name__)


class PipelineSession:
    """One stage of a pipeline run on a worker (see the module doc); ``run`` is its state."""

    def __init__(self, worker: Worker, run: Run) -> None:
        self.worker = worker
        self.run = run
        self.run_id = run.run_id
        self.replicas = Replicas(worker, run)  # this run's snapshots and the replicas held here
        self.repartitioning = Repartitioning(self)  # re-splits: the layers fetched, served, committed
        self.commands = RunCommands(self)  # stop, collect, ping, measure a link, set the compression
        # Forward, backward and evaluation with their messages and the device's fault hooks.
        self.stage_step = StageStep(worker.send, worker.topics, worker.device_id, worker.times, worker)

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
        keep = log_bound(msg.chain_every, msg.in_flight or len(msg.points)) if msg.recovery_logs else 0
        return Run(
            msg.run_id,
            spec,
            msg.seed,
            options,
            msg.plan_id,
            list(msg.points),
            list(msg.worker_list),
            index,
            StageRunner(stage, index, log_keep=keep),
            next_forward=start_id,
            next_backward=start_id,
            chain_every=msg.chain_every,
            global_every=msg.global_every,
            replicas=msg.replicas,
            replica_share=msg.replica_share,
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
        self.subscribe_stage()
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
        self.repartitioning.say_ready("built")

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

    def subscribe_stage(self) -> None:
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

    def end(self, *, rejoin: bool = False) -> None:
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
        run = self.run
        groups = [[d] for d in run.worker_list]
        if run.stand_in and run.index + 1 < len(groups):
            # A recovery without a rollback: the central node sends the dead next stage's gradients.
            groups[run.index + 1].append(run.worker_list[0])
        return PlanView(run.run_id, run.plan_id, groups)

    def handlers(self) -> dict[type[Message], Handler]:
        return {
            Activation: self._on_activation,
            Gradient: self._on_gradient,
            **self.repartitioning.handlers(),
            Status: self._on_status,
            **self.commands.handlers(),
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
        if run.resend is not None:
            self.commands.resend_when_drained()

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
        self.commands.profile_changed()

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
            self.end(rejoin=verdict.action == "leave")

    # -- compute -------------------------------------------------------------------------------

    def _forward(self, msg: Activation) -> None:
        run = self.run
        run.next_forward = msg.batch_id + 1
        run.batch_size = int(msg.y.shape[0])
        run.last = "F"
        batch = run.options.batch_of(msg.batch_id)
        # The sync schedule's micro-batch: its rows of the batch go on with it, and on the last stage
        # its loss is over the whole batch's rows (Activation.total).
        result = self.stage_step.forward(
            run.runner,
            msg.batch_id,
            msg.tensor,
            msg.y,
            run_id=msg.run_id,
            plan_id=msg.plan_id,
            slowdown=self.worker.slowdown,
            epoch=batch // max(1, run.batches_per_epoch),
            version=msg.version,
            batch=batch,
            rows=msg.rows,
            total=msg.total,
        )
        if result is None:
            return  # sent on to the next stage
        run.next_backward = msg.batch_id + 1
        if not math.isfinite(result.loss):
            self._diverged(msg.batch_id, result.loss)
            return
        self._batch_done(msg.batch_id)
        self._send_gradient(msg.batch_id, result.grad_input, result.loss, result.correct, [])

    def _backward(self, msg: Gradient) -> None:
        run = self.run
        run.next_backward = msg.batch_id + 1
        run.last = "B"
        result = self.stage_step.backward(
            run.runner,
            msg.batch_id,
            slowdown=self.worker.slowdown,
            grad_output=msg.tensor,
            batch=run.options.batch_of(msg.batch_id),
        )
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
        run = self.run
        # The average time per batch rides with the gradients to the central node (Sec. III-D).
        self.stage_step.send_gradient(
            run.runner,
            grad,
            run_id=run.run_id,
            plan_id=run.plan_id,
            batch_id=batch_id,
            loss=loss,
            correct=correct,
            downstream=downstream,
            batch=run.options.batch_of(batch_id),
        )

    def _evaluate(self, msg: Activation) -> None:
        self.stage_step.evaluate(
            self.run.runner,
            msg.batch_id,
            msg.tensor,
            msg.y,
            run_id=msg.run_id,
            plan_id=msg.plan_id,
            slowdown=self.worker.slowdown,
            version=msg.version,
        )

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
