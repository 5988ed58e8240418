"""The training loop of the central node (papers/000 Sec. III-C): stage 0 under 1F1B with a bound on the
batches in flight, re-splits when the planning job proposes one, evaluation at every epoch's end, and
recovery when a fault is returned (faults are values: every step returns one or None)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from edgeagent.data import batch_indices
from edgeagent.errors import DivergedError, EdgeAgentError, TrainingError
from edgeagent.modes.pipeline.central.checkpoint import Checkpoints
from edgeagent.modes.pipeline.central.context import Fault, Plan, RunState
from edgeagent.modes.pipeline.central.evaluation import Evaluation
from edgeagent.modes.pipeline.central.liveness import Liveness
from edgeagent.modes.pipeline.central.planning import Planning
from edgeagent.modes.pipeline.central.recovery import Recovery
from edgeagent.modes.pipeline.central.setup import Setup
from edgeagent.modes.pipeline.central.switching import Switching
from edgeagent.pipeline.divergence import blown_up, diverged_into_nonfinite, loss_not_finite
from edgeagent.pipeline.rows import split_rows
from edgeagent.pipeline.schedule import admit
from edgeagent.protocol.messages import Gradient
from edgeagent.roles.central.report import RunReport
from edgeagent.runtime.compute import Clock

log = logging.getLogger("edgeagent.roles.central")


@dataclass
class Loop:
    """Where the training loop is (Table I's committed ids and what is pending)."""

    next_f: int  # next global batch id to forward
    committed: int  # committed backward id
    window_start: float
    losses: list[float] = field(default_factory=list)
    pending: Plan | None = None  # a new split, applied once the pipeline is drained
    window_batches: int = 0  # batches since the split changed (the measured step of a plan check)
    eval_due: int | None = None  # the committed id whose epoch-end evaluation is due
    # The synchronous schedule: micro-batches of batch committed + 1 forwarded and backwarded here, and
    # the loss and correct predictions of those backwarded.
    micro_f: int = 0
    micro_b: int = 0
    micro_loss: float = 0.0
    micro_correct: int = 0

    def reset_micro(self) -> None:
        self.micro_f = self.micro_b = self.micro_correct = 0
        self.micro_loss = 0.0

    def restart_window(self) -> None:
        self.window_start, self.window_batches = time.perf_counter(), 0


class Trainer:
    """One run of the pipeline mode on the central node: :meth:`execute` returns its report."""

    def __init__(
        self,
        state: RunState,
        setup: Setup,
        planning: Planning,
        liveness: Liveness,
        checkpoints: Checkpoints,
        switching: Switching,
        evaluation: Evaluation,
        recovery: Recovery,
    ) -> None:
        self.state = state
        self.setup = setup
        self.planning = planning
        self.liveness = liveness
        self.checkpoints = checkpoints
        self.switching = switching
        self.evaluation = evaluation
        self.recovery = recovery

    def execute(self) -> RunReport:
        """Build the workers' stages, measure the links, then train to the end (Sec. III-B, III-C)."""
        state = self.state
        self.setup.build_workers()
        if state.config.home_assistant:
            self.setup.announce_to_home_assistant()
        state.links = self.setup.measure_links()
        self.setup.pace_slow_uplinks()
        state.report.links = [{"bandwidth": lk.bandwidth, "latency": lk.latency} for lk in state.links]
        self.planning.apply_compression(epoch=state.start_version // max(1, state.per_epoch))
        self.planning.record_partition(
            state.start_version,
            "resumed from a checkpoint" if state.resume else self.planning.initial_reason(),
        )
        self._plan_before_training()
        self._train()
        return state.report

    def metrics(self) -> dict[str, Any] | None:
        """What the central node publishes on its metrics topic (docs/protocol.md)."""
        state = self.state
        report = state.report
        if not state.train_started:
            return None
        t = state.times.summary()
        last = report.timeline[-1] if report.timeline else None
        done = len(report.timeline)
        return {
            "stage": 0,
            "batches": done,
            "epoch": min(state.train.epochs - 1, done // max(1, state.per_epoch)),  # in progress, from 0
            "samples_per_second": done * state.train.batch_size / max(1e-9, state.clock()),
            "compute_s": round(t["compute"], 3),
            "communication_s": round(t["communication"], 3),
            "idle_s": round(t["idle"], 3),
            "wall_s": round(t["wall"], 3),
            "loss": last["loss"] if last else None,
            "accuracy": report.test_accuracy_per_epoch[-1] if report.test_accuracy_per_epoch else None,
            "points": list(state.points),
            "workers": list(state.worker_list[1:]),
            "status": state.status,
            "compression_ratio": round(state.codecs.ratio, 3),
            "slowdown": state.config.slowdown,
            "link_mbps": state.config.link_mbps,
        }

    def _plan_before_training(self) -> None:
        """Before batch 0, over the measured links: ``--partition oracle``, the DP fed the true slowdowns;
        the latency predictor, the DP fed every device's predicted times (AccEPT eq. 10)."""
        state = self.state
        if len(state.worker_list) < 2:
            return
        if state.config.partition == "oracle":
            caps, reason = self.planning.true_capacities(), "oracle: the DP fed the true slowdowns"
        elif state.device_times is not None:
            caps, reason = (
                self.planning.first_capacities(),
                "predictor: the DP fed the devices' predicted times",
            )
        else:
            return
        points = self.planning.solve(self.planning.problem(caps))
        fault = self.switching.switch_to(points, version=0) if points != state.points else None
        if fault is not None:
            raise TrainingError(f"before training started: {fault.reason}")
        self.planning.record_partition(0, reason)

    def _evaluation_missing(self, committed: int) -> bool:
        """Whether the epoch-end evaluation at ``committed`` is due: an evaluation a fault interrupted is
        due again after the recovery, also when the rollback replays no batch of that epoch (and a run
        resumed from a checkpoint written before its epoch's evaluation was over evaluates first)."""
        state = self.state
        at_end = (committed + 1) % state.per_epoch == 0 or committed + 1 == state.total
        return (
            committed >= 0
            and at_end
            and len(state.report.test_accuracy_per_epoch) <= committed // state.per_epoch
        )

    def _train(self) -> None:
        state = self.state
        committed = state.start_version - 1
        loop = Loop(next_f=committed + 1, committed=committed, window_start=time.perf_counter())
        loop.eval_due = committed if self._evaluation_missing(committed) else None
        state.times.reset()
        state.eval_seconds = 0.0
        state.train_started = time.perf_counter()
        self.liveness.refresh_deadline()
        try:
            while (fault := self._run_until_fault(loop)) is not None:
                # A fault that comes back at the same batch after every recovery (a device that keeps
                # sending NaN) must not make the run recover forever.
                stalled = state.stalls.fault(loop.committed, fault.reason, state.node.nonfinite)
                if stalled is not None:
                    recent = loop.losses[-5:]
                    if blown_up(recent, state.spec.num_classes):  # lr far too large, not a broken device
                        high = max(recent, key=lambda v: v if v == v else float("inf"))
                        lr = state.train.learning_rate
                        raise DivergedError(diverged_into_nonfinite(loop.committed, high, lr, stalled))
                    raise TrainingError(stalled)
                loop.committed = self.recovery.recover_until_done(
                    fault, loop.committed, finish=lambda grad: self._backward(loop, grad)
                )
                loop.next_f = loop.committed + 1
                loop.reset_micro()
                loop.pending = None
                state.plan_job = None
                loop.eval_due = loop.committed if self._evaluation_missing(loop.committed) else None
                loop.restart_window()
        except DivergedError as exc:
            # The loss is not finite (or stayed above chance's): nothing more to learn from this run.
            state.report.diverged = str(exc)
            if state.train.divergence == "stop":
                raise
            log.error("%s; the run ends here (divergence: warn)", exc)
            loop.eval_due = None
        self._finish_report(loop)

    def _run_until_fault(self, loop: Loop) -> Fault | None:
        """Train until every batch is committed and evaluated (None) or a fault is detected (returned)."""
        while loop.committed + 1 < self.state.total or loop.eval_due is not None:
            fault = self._tick(loop)
            if fault is not None:
                return fault
        return None

    def _tick(self, loop: Loop) -> Fault | None:
        """One step: an evaluation that is due, a new split, a backward, a forward, or a wait."""
        state = self.state
        if state.inbox.diverged:
            raise DivergedError(state.inbox.diverged)
        if loop.eval_due is not None:
            return self._evaluate_due(loop)
        if state.options.micro_batches:
            return self._tick_sync(loop)
        in_flight = loop.next_f - loop.committed - 1
        if loop.pending is not None and in_flight == 0:
            return self._apply_pending(loop)
        self._take_plan(loop)
        grad = state.inbox.gradients.pop(loop.committed + 1, None)
        if grad is not None or (state.stage.is_last and in_flight > 0):
            self._backward(loop, grad)
            return None
        epoch_end = min(
            state.total,
            (loop.committed + 1) // state.per_epoch * state.per_epoch + state.per_epoch,
        )
        if loop.next_f < epoch_end and loop.pending is None and admit(in_flight, state.bound()):
            self._forward(loop)
            return None
        return self.liveness.wait_for_messages(next_batch=loop.committed + 1)

    def _tick_sync(self, loop: Loop) -> Fault | None:
        """The synchronous schedule (PipeDream-flush): the micro-batches of batch ``committed + 1`` in
        1F1B order, at most ``bound()`` in flight; every stage applies the batch's update at its last
        micro-batch, and the next batch starts only when stage 0 has (the flush): exact SGD."""
        state = self.state
        micro = state.options.micro_batches
        bid = loop.committed + 1
        if loop.micro_f == 0:
            if loop.pending is not None:
                return self._apply_pending(loop)
            self._take_plan(loop)
            if loop.pending is not None:
                return None
        item = bid * micro + loop.micro_b
        if loop.micro_b < loop.micro_f:
            grad = state.inbox.gradients.pop(item, None)
            if grad is not None or state.stage.is_last:
                self._backward_micro(loop, grad)
                return None
        if loop.micro_f < micro and admit(loop.micro_f - loop.micro_b, state.bound()):
            self._forward_micro(loop)
            return None
        return self.liveness.wait_for_messages(next_batch=item)

    def _micro_rows(self, bid: int, j: int) -> tuple[torch.Tensor, torch.Tensor, int, int, int]:
        """Micro-batch ``j`` of batch ``bid``: its inputs, labels, rows ``[lo, hi)`` and the batch's rows."""
        x, y = self._batch(bid)
        total = int(y.shape[0])
        lo, hi = split_rows(total, [1.0] * self.state.options.micro_batches)[j]
        return x[lo:hi], y[lo:hi], lo, hi, total

    def _forward_micro(self, loop: Loop) -> None:
        state = self.state
        bid, j = loop.committed + 1, loop.micro_f
        item = bid * state.options.micro_batches + j
        started = Clock(state.config.slowdown)
        x, y, lo, hi, total = self._micro_rows(bid, j)
        state.stage_step.forward(
            state.runner,
            item,
            x,
            y,
            run_id=state.run_id,
            plan_id=state.plan_id,
            slowdown=state.config.slowdown,
            epoch=bid // state.per_epoch,
            rows=[lo, hi],
            total=total,
            loss_here=False,
            started=started,
        )
        if j == 0:
            state.sent_at[bid] = time.monotonic()
        loop.micro_f += 1
        loop.next_f = bid + 1 if loop.micro_f == state.options.micro_batches else bid

    def _backward_micro(self, loop: Loop, grad: Gradient | None) -> None:
        """Backward of the oldest micro-batch in flight; at the batch's last, its update and commit."""
        state = self.state
        micro = state.options.micro_batches
        bid, j = loop.committed + 1, loop.micro_b
        item = bid * micro + j
        started = Clock(state.config.slowdown)
        step, slowdown = state.stage_step, state.config.slowdown
        if state.stage.is_last:
            _, y, _, _, total = self._micro_rows(bid, j)
            result = step.backward(
                state.runner, item, slowdown=slowdown, labels=y, total=total, started=started
            )
            loss, correct = result.loss, result.correct
            if not math.isfinite(loss):
                raise DivergedError(loss_not_finite(bid, loss, state.train.learning_rate))
        else:
            assert grad is not None
            step.backward(state.runner, item, slowdown=slowdown, grad_output=grad.tensor, started=started)
            loss, correct = grad.loss, grad.correct
            state.stage_times = list(grad.stage_times)
        loop.micro_b += 1
        loop.micro_loss += loss
        loop.micro_correct += correct
        if loop.micro_b < micro:
            return
        if not state.stage.is_last:
            state.stage_history.append(tuple(state.stage_times))
            self.liveness.refresh_deadline()
        state.runner.batch_done()
        loss, correct = loop.micro_loss, loop.micro_correct
        loop.reset_micro()
        self._commit(loop, bid, loss, correct)

    def _evaluate_due(self, loop: Loop) -> Fault | None:
        assert loop.eval_due is not None
        started = time.perf_counter()
        try:
            fault = self.evaluation.end_epoch(loop.eval_due, loop.losses)
        finally:
            self.state.eval_seconds += time.perf_counter() - started
        if fault is None:
            loop.eval_due = None
        return fault

    def _apply_pending(self, loop: Loop) -> Fault | None:
        """The pipeline is drained: admit the joiners and switch to the pending split."""
        plan = loop.pending
        assert plan is not None
        version = loop.committed + 1
        fault = self.switching.admit_joiners(plan, version) or self.switching.switch_to(
            plan.points, version=version, workers=plan.workers, reason=plan.reason, groups=plan.groups
        )
        if fault is None:
            loop.pending = None
            loop.restart_window()
        return fault

    def _take_plan(self, loop: Loop) -> None:
        """If the planning job is done and proposes another split, make it pending (applied when drained)."""
        state = self.state
        if state.plan_job is None or not state.plan_job.done():
            return
        job, state.plan_job = state.plan_job, None
        try:
            plan = job.result()
        except (EdgeAgentError, ValueError) as exc:
            log.warning("re-partition skipped: %s", exc)
            return
        measured = (time.perf_counter() - loop.window_start) / max(1, loop.window_batches)
        # A plan kept without planning (no device's h changed) predicts nothing: say so, not "0.0".
        predicted = f"{1e3 * plan.predicted:.1f} predicted" if plan.predicted > 0 else "nothing predicted"
        log.info(
            "plan check at batch %d: %.1f ms/batch measured, %s for %s (%s)",
            loop.committed + 1,
            1e3 * measured,
            predicted,
            plan.points,
            plan.reason,
        )
        if (
            plan.points == state.points
            and plan.workers == state.worker_list
            # (same devices with other shares: a re-share, a plan of its own)
            and (
                plan.groups is None
                or (plan.groups.members, plan.groups.shares) == (state.groups.members, state.groups.shares)
            )
        ):
            return
        loop.pending = plan
        state.report.partitions.append(
            {
                "batch": loop.committed + 1,
                "points": plan.points,
                "workers": plan.workers[1:],
                "plan_id": state.plan_id + 1,
                "reason": plan.reason,
                "predicted_step": plan.predicted,
                "measured_step_before": measured,
                **(
                    {
                        "groups": [list(g) for g in plan.groups.members],
                        "shares": [list(s) for s in plan.groups.shares],
                    }
                    if plan.groups is not None
                    else {}
                ),
            }
        )

    def _batch(self, global_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs and labels of a global batch id (each epoch's order from the seed)."""
        state = self.state
        epoch, i = divmod(global_id, state.per_epoch)
        order = state.batch_orders.get(epoch)
        if order is None:
            n_train = state.data.x_train.shape[0]
            order = batch_indices(n_train, state.train.batch_size, epoch=epoch, seed=state.train.seed)
            state.batch_orders = {epoch: order}  # one epoch's order at a time
        idx = order[i]
        return state.data.x_train[idx], state.data.y_train[idx]

    def _forward(self, loop: Loop) -> None:
        state = self.state
        started = Clock(state.config.slowdown)
        x, y = self._batch(loop.next_f)
        # Forward of this batch; its backward comes after other batches' forwards: the window pairs each
        # backward with the latest forward, which averages the same (the step adds to a fresh count).
        state.runner.step_seconds = 0.0
        state.stage_step.forward(
            state.runner,
            loop.next_f,
            x,
            y,
            run_id=state.run_id,
            plan_id=state.plan_id,
            slowdown=state.config.slowdown,
            epoch=loop.next_f // state.per_epoch,
            loss_here=False,
            started=started,
        )
        if not state.stage.is_last:
            state.sent_at[loop.next_f] = time.monotonic()
        loop.next_f += 1

    def _backward(self, loop: Loop, grad: Gradient | None) -> None:
        """Backward of the oldest batch in flight; then its bookkeeping (replication, re-split, epoch)."""
        state = self.state
        bid = loop.committed + 1
        started = Clock(state.config.slowdown)
        step, slowdown = state.stage_step, state.config.slowdown
        if state.stage.is_last:
            _, y = self._batch(bid)
            result = step.backward(state.runner, bid, slowdown=slowdown, labels=y, started=started)
            loss, correct = result.loss, result.correct
            if not math.isfinite(loss):
                raise DivergedError(loss_not_finite(bid, loss, state.train.learning_rate))
        else:
            assert grad is not None
            step.backward(state.runner, bid, slowdown=slowdown, grad_output=grad.tensor, started=started)
            loss, correct = grad.loss, grad.correct
            state.stage_times = list(grad.stage_times)
            state.stage_history.append(tuple(grad.stage_times))
            self.liveness.refresh_deadline()
        state.runner.batch_done()
        self._commit(loop, bid, loss, correct)

    def _commit(self, loop: Loop, bid: int, loss: float, correct: int) -> None:
        """Batch ``bid``'s update is applied on stage 0 (and so on every stage): Table I's committed id,
        the timeline, replication, progress and the epoch's end."""
        state = self.state
        loop.committed = bid
        state.sent_at.pop(bid, None)
        loop.losses.append(loss)
        loop.window_batches += 1
        elapsed = state.last_progress = state.clock()
        state.report.timeline.append({"batch": bid, "t": round(elapsed, 4), "loss": loss})
        self._after_batch(bid + 1, loss, correct)
        epoch_end = min(state.total, bid // state.per_epoch * state.per_epoch + state.per_epoch)
        if bid + 1 == epoch_end:
            loop.eval_due = bid

    def _after_batch(self, done: int, loss: float, correct: int) -> None:
        """``done`` batches are committed: replicate, tell the user, apply slowdown changes, plan."""
        state = self.state
        every = state.config.global_every
        if state.chain.due(done) or (every and done % every == 0):
            state.store.snapshot(state.stage)  # stage 0's own weights at this replication point
            self.checkpoints.maybe_checkpoint(done)  # the workers' replicas of it may all be in already
        state.retune_chain(done)
        state.notify(batch=done, total=state.total, loss=loss, correct=correct)
        while state.changes and state.changes[0][1] <= done:
            device, at, factor = state.changes.pop(0)
            self.planning.emulate(device, factor, at)
        # With the predictor a new h (a device measured again after a drift) is planned at once.
        check = state.policy.due(done) or state.h_changed or done == state.recheck_at
        if state.resplits and check and done < state.total:
            self.planning.start_planning(done)

    def _finish_report(self, loop: Loop) -> None:
        state = self.state
        report = state.report
        report.train_seconds = state.clock()
        t = state.times.summary()
        log.info(
            "central: of %.1f s: compute %.1f, communication %.1f, idle %.1f",
            t["wall"],
            t["compute"],
            t["communication"],
            t["idle"],
        )
        report.batches = loop.committed + 1
        report.compression = state.config.compression
        report.compression_ratio = state.codecs.ratio
        report.compression_ratio_tensors = state.codecs.tensor_ratio
        report.epochs = len(report.test_accuracy_per_epoch)
        # Each batch of the run counts once: batches replayed after a rollback are time lost, not work.
        samples = (report.batches - state.start_version) * state.train.batch_size
        report.samples_per_second = samples / report.train_seconds if report.train_seconds else 0.0
        if report.test_accuracy_per_epoch:
            report.final_accuracy = report.test_accuracy_per_epoch[-1]
        elif state.total and not report.diverged:  # a diverged model's outputs are not finite
            evaluated = self.evaluation.evaluate()
            if isinstance(evaluated, Fault):
                raise TrainingError(f"the final evaluation failed: {evaluated.reason}")
            report.final_accuracy = evaluated[0]
