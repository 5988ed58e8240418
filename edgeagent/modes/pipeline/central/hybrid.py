"""The hybrid mode's run on the central node: the pipeline run where a stage may be held by several devices.

What differs from the pipeline run (papers/000) is here, as hybrid variants of its parts that
:class:`~edgeagent.modes.pipeline.central.run.HybridRun` holds instead:

* **Planning** with :func:`edgeagent.planner.hybrid.solve_hybrid` over every device the run knows (the
  stages' devices, devices it left out, devices that joined): the split, the devices of each stage and
  their shares of the rows. The first plan assumes equal devices (PipeDream's start), or their true
  speeds with ``--partition oracle`` (the optimum from batch 0); later re-splits use each device's
  measured seconds per batch (``Gradient.device_times``).
* **Pieces:** the stage after stage 0 may be several devices, each sending the gradient of its rows;
  they are collected into the batch's gradient (:class:`~edgeagent.pipeline.rows.RowBuffer`), and the
  last stage's evaluation results are added up over a tiling of each batch's rows.
* **Failover inside a stage:** a dead device whose stage has other devices is not a fault: the survivors
  take its share (``Reshare``), with no rollback and no layers moved. A stage left with no device falls
  back to the pipeline's recovery.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from edgeagent.compression import CompressionError
from edgeagent.compression.stage import restore
from edgeagent.errors import PlanningError, TrainingError
from edgeagent.modes.pipeline.central.checkpoint import Checkpoints
from edgeagent.modes.pipeline.central.context import Fault, Plan, RunState
from edgeagent.modes.pipeline.central.estimation import Estimation
from edgeagent.modes.pipeline.central.evaluation import Evaluation
from edgeagent.modes.pipeline.central.handlers import Handlers
from edgeagent.modes.pipeline.central.hybrid_feedback import Feedback, plan_key
from edgeagent.modes.pipeline.central.hybrid_first import FirstStage
from edgeagent.modes.pipeline.central.liveness import Liveness
from edgeagent.modes.pipeline.central.planning import Planning
from edgeagent.modes.pipeline.central.recovery import Recovery
from edgeagent.modes.pipeline.central.setup import Setup
from edgeagent.modes.pipeline.central.switching import Switching
from edgeagent.modes.pipeline.central.trainer import Trainer
from edgeagent.pipeline.groups import Groups, cover
from edgeagent.pipeline.rows import RowBuffer, gradient_piece
from edgeagent.planner.hybrid import Device, HybridPlan, HybridProblem, predict_hybrid
from edgeagent.planner.hybrid_dp import solve_hybrid
from edgeagent.protocol.commands import Reshare
from edgeagent.protocol.messages import EvalResult, Gradient, GradSync, Message
from edgeagent.protocol.topics import Family
from edgeagent.runtime.role import Inbound

log = logging.getLogger("edgeagent.roles.central")

RESPLIT_GAIN = 0.05  # a new hybrid plan must be this much faster (predicted) than the current one
MIN_NORMALISED_ROWS = 8  # rows of a batch per member of a replicated stage, at least, with batch norm


class HybridPlanning(Planning):
    """The hybrid DP's plans: the first over every discovered device, re-splits from each device's
    measured seconds per batch (its capacity), kept unless they gain ``RESPLIT_GAIN``."""

    def __init__(self, state: RunState, feedback: Feedback, estimation: Estimation) -> None:
        super().__init__(state, estimation)
        self.feedback = feedback
        self.device_caps: dict[str, float] = {}  # measured capacity of every device (per whole batch)

    @property
    def oracle(self) -> bool:
        return self.state.config.partition == "oracle"

    def initial_points(self) -> list[int]:
        """The first plan over every discovered device: equal devices, or the true speeds (oracle)."""
        devices = list(self.state.worker_list)
        caps = [self.true_cap(d) if self.oracle else self.estimation.first_cap(d) for d in devices]
        plan = self.solve_hybrid(devices, caps, [math.inf] * len(devices))
        self._adopt_plan(plan, devices)
        return list(plan.points)

    def true_cap(self, device: str) -> float:
        state = self.state
        if device == state.device_id:
            return state.config.slowdown
        w = state.workers.get(device)
        return w.slowdown if w is not None else 1.0

    def solve_hybrid(self, devices: list[str], caps: list[float], bandwidths: list[float]) -> HybridPlan:
        """The DP's plan (stage 0 replicated, ``replicate_first``, only where it predicts that faster)."""
        try:
            return solve_hybrid(self._hybrid_problem(devices, caps, bandwidths))
        except ValueError as exc:
            raise PlanningError(
                f"{exc}; give the devices more memory (--memory-limit-mb, device profiles), add devices, "
                "or lower --in-flight / the batch size"
            ) from None

    def _hybrid_problem(
        self, devices: list[str], caps: list[float], bandwidths: list[float]
    ) -> HybridProblem:
        state = self.state
        latency = max((lk.latency for lk in state.links), default=0.0)
        return HybridProblem(
            layer_times=tuple(state.profile.seconds),
            output_bytes=tuple(state.profile.output_bytes),
            devices=tuple(
                Device(
                    capacity=c,
                    bandwidth=b,
                    latency=latency if k else 0.0,
                    memory_limit=(self._limit_of(d) or None) if k else None,
                )
                for k, (d, c, b) in enumerate(zip(devices, caps, bandwidths, strict=True))
            ),
            param_bytes=state.param_bytes,
            in_flight=state.train.in_flight,
            activation_factor=self._comm_factor(len(state.worker_list)),
            max_replicas=state.config.max_replicas,
            min_share=self._min_share(),
            # The synchronous schedule's micro-batches are the central node's alone.
            replicate_first=state.config.replicate_first and not state.options.micro_batches,
            input_bytes=self._input_bytes(),
        )

    def _input_bytes(self) -> int:
        """One batch's inputs and labels as the central node sends them to stage 0's helpers."""
        data = self.state.data
        row = data.x_train[:1]
        return self.state.train.batch_size * (row.numel() * row.element_size() + 8)

    def _min_share(self) -> float:
        """No member of a replicated stage gets fewer than ``MIN_NORMALISED_ROWS`` rows of a batch when
        the model normalises its batches (statistics of 3 rows are noise: training stalls)."""
        if not self.state.normalises:
            return 0.0
        return min(1.0, MIN_NORMALISED_ROWS / max(1, self.state.train.batch_size))

    def _adopt_plan(self, plan: HybridPlan, devices: list[str]) -> None:
        groups = self.groups_of(plan, devices)
        self.state.groups = groups
        self.state.worker_list = groups.primaries
        left_out = [d for d in devices if d not in groups.devices]
        log.info(
            "hybrid plan: layers %s held by %s%s (predicted %.1f ms per batch)",
            list(plan.points),
            [list(g) for g in groups.members],
            f"; left out: {left_out}" if left_out else "",
            1e3 * plan.time,
        )

    def bandwidths(self, devices: list[str]) -> list[float]:
        """Each device's link to the broker for the DP: the slowest measured stage link (links are
        measured between consecutive stages, not per device; the central node is the broker's host)."""
        slowest = min((lk.bandwidth for lk in self.state.links), default=math.inf)
        return [math.inf, *[slowest] * (len(devices) - 1)]

    def groups_of(self, plan: HybridPlan, devices: list[str]) -> Groups:
        return Groups(
            tuple(tuple(devices[d] for d in group) for group in plan.groups),
            plan.shares,
            self.state.groups.version,
        )

    def record_partition(self, batch: int, reason: str, predicted: float | None = None) -> None:
        state = self.state
        if batch == state.start_version and not state.report.partitions and not state.resume:
            reason = (
                "initial: the hybrid DP fed the true speeds (oracle), links not measured yet"
                if self.oracle
                else "initial: the hybrid DP over equal devices, links not measured yet"
            )
        super().record_partition(batch, reason, predicted)
        state.report.partitions[-1]["groups"] = [list(g) for g in state.groups.members]
        state.report.partitions[-1]["shares"] = [list(s) for s in state.groups.shares]

    def _stage_work(self, device: str) -> float:
        state = self.state
        k = state.groups.stage_of(device)
        if k is None:
            return 0.0
        return sum(state.profile.seconds[state.points[k] : state.points[k + 1]])

    def note_device_times(self, times: dict[str, float]) -> None:
        """Each device's capacity from its seconds per whole batch (papers/000 eq. 1-3, per device)."""
        for device, seconds in times.items():
            work = self._stage_work(device)
            if work > 0 and seconds > 0:
                self.device_caps[device] = seconds / work
        group_times = []
        for group in self.state.groups.members[1:]:
            known = [times[d] for d in group if times.get(d, 0) > 0]
            group_times.append(1.0 / sum(1.0 / t for t in known) if len(known) == len(group) else 0.0)
        if all(group_times):
            self.state.stage_times = group_times

    def start_planning(self, done: int) -> None:
        """The hybrid DP over every device the run may use, from measured capacities where known (after
        ``done`` batches)."""
        state = self.state
        caps = self.measured_capacities()
        if caps is None or state.plan_job is not None:
            return
        # Its seconds per whole batch (with helpers on stage 0 it computes its share of the rows).
        own = sum(state.runner.recent) / max(1, len(state.runner.recent)) / state.groups.shares[0][0]
        work0 = sum(state.profile.seconds[state.points[0] : state.points[1]])
        if work0 > 0 and own > 0:
            self.device_caps[state.device_id] = own / work0
        devices = [state.device_id, *sorted(d for d in self.usable() if d != state.device_id)]
        for device in self.feedback.retry_left_out(done, devices[1:], self.device_caps):
            log.info("%s, left out of the plan for its speed, is planned again at the others' mean", device)
        known = [c for d, c in self.device_caps.items() if d != state.device_id] or [1.0]
        mean = sum(known) / len(known)
        device_caps = [self.device_caps.get(d, mean) for d in devices]
        bandwidths = self.bandwidths(devices)
        current = self._current_time(devices, device_caps, bandwidths)
        job: Future[Plan] = Future()

        def run() -> None:
            try:
                plan = self.solve_hybrid(devices, device_caps, bandwidths)
                groups = self.groups_of(plan, devices)
                moving = (groups.members, groups.shares, list(plan.points)) != (
                    state.groups.members,
                    state.groups.shares,
                    state.points,
                )
                if moving and plan_key(list(plan.points), groups) in self.feedback.rejected:
                    groups, points = state.groups, list(state.points)
                    reason = "kept: the hybrid DP's plan was measured slower than this one before"
                    job.set_result(Plan(points, current, reason, groups.primaries, groups))
                    return
                # A switch drains the pipeline and moves layers: only for a clear gain (5 %).
                if moving and not plan.time < (1 - RESPLIT_GAIN) * current:
                    groups, points = state.groups, list(state.points)
                    reason = (
                        f"kept: the hybrid DP's plan would gain {1e3 * (current - plan.time):.1f} ms/batch"
                    )
                    job.set_result(Plan(points, current, reason, groups.primaries, groups))
                    return
                reason = f"hybrid DP: {1e3 * current:.1f} -> {1e3 * plan.time:.1f} ms/batch predicted"
                job.set_result(Plan(list(plan.points), plan.time, reason, groups.primaries, groups))
            except Exception as exc:  # a planning bug must not stop training: keep the split
                job.set_exception(exc)

        if state.node.background(run, f"plan-{state.plan_id}"):
            state.plan_job = job

    def _current_time(self, devices: list[str], caps: list[float], bandwidths: list[float]) -> float:
        """The predicted seconds per batch of the current plan under the same model as the new one."""
        index = {d: k for k, d in enumerate(devices)}
        try:  # with the shares it runs with (from older measurements), not the ones these caps give
            groups, shares = self.state.groups.indexed(index)
            problem = replace(self._hybrid_problem(devices, caps, bandwidths), min_share=0.0)
            return predict_hybrid(problem, self.state.points, groups, shares)
        except (KeyError, ValueError):
            return math.inf

    def usable(self) -> list[str]:
        """Devices the next plan may use: the live devices of the run, those it left out, joiners."""
        live = [d for d, w in self.state.workers.items() if w.online]
        return list(dict.fromkeys([*live, *self.state.joiners]))


class HybridHandlers(Handlers):
    """Pieces: the gradients of stage 1's devices and the evaluation results of the last stage's,
    each of some of a batch's rows, put together into whole ones."""

    def __init__(
        self,
        state: RunState,
        estimation: Estimation,
        planning: HybridPlanning,
        checkpoints: Checkpoints,
        first: FirstStage,
    ) -> None:
        super().__init__(state, estimation, checkpoints)
        self.planning = planning
        self.first = first
        self.grad_pieces: dict[int, tuple[RowBuffer, dict[str, float]]] = {}
        self.eval_pieces: dict[int, dict[tuple[int, int], EvalResult]] = {}

    def handlers(self) -> dict[type[Message], Callable[[Inbound], None]]:
        return {**super().handlers(), GradSync: self.on_sync}

    def on_sync(self, item: Inbound) -> None:
        """A helper of stage 0's gradient sum (stage 0 replicated)."""
        problem = self.first.on_sync(item)
        if problem is not None:
            self.state.node.discard(item, problem)

    def on_gradient(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, Gradient)
        if not self._ours(msg) or msg.plan_id != self.state.plan_id:
            return
        problem = self._take_piece(msg)
        if problem is not None:
            self.state.node.discard(item, f"gradient of batch {msg.batch_id}: {problem}")

    def _take_piece(self, msg: Gradient) -> str | None:
        state = self.state
        expected = state.runner.outputs.get(msg.batch_id)
        if expected is None:
            return None  # committed already (a piece computed again after a failover), or stale
        try:
            g = restore(msg.g)
        except CompressionError as exc:
            return str(exc)
        shape, dtype = expected
        rows = self.first.expected_rows(msg.batch_id)  # stage 0 replicated: the central node has some rows
        if rows is not None:
            shape = (rows, *shape[1:])
        (lo, hi), total, columns = gradient_piece(msg, g)
        if total != shape[0] or tuple(g.shape) != (hi - lo, *shape[1:]) or g.dtype != dtype:
            return f"rows [{lo}, {hi}) of {total} shaped {tuple(g.shape)} do not fit the output {shape}"
        buffer, times = self.grad_pieces.setdefault(msg.batch_id, (RowBuffer(total), {}))
        problem = buffer.add(lo, hi, columns)
        if problem is not None:
            return problem
        times.update(msg.device_times)
        if buffer.complete:
            del self.grad_pieces[msg.batch_id]
            self.planning.note_device_times(times)
            whole = buffer.take(0, total)
            state.inbox.gradients[msg.batch_id] = Gradient(
                run_id=msg.run_id,
                plan_id=msg.plan_id,
                stage=msg.stage,
                batch_id=msg.batch_id,
                g=whole["g"],
                loss=float(whole["loss"].sum()) / total,
                correct=int(whole["correct"].sum()),
                stage_times=list(state.stage_times),
                device_times=times,
            )
        return None

    def _take_result(self, msg: EvalResult) -> None:
        """The last stage's devices each send the result of their rows: a batch's result is whole once
        pieces tile its rows (after a failover, pieces of two splits may be there)."""
        if msg.batch_id in self.state.inbox.results:
            return  # whole already (a piece computed again after a failover)
        total = msg.total or msg.count
        lo, hi = msg.rows or (0, total)
        pieces = self.eval_pieces.setdefault(msg.batch_id, {})
        pieces[(lo, hi)] = msg
        tiling = cover(pieces, total)
        if tiling is None:
            return
        parts = [pieces[rows] for rows in tiling]
        del self.eval_pieces[msg.batch_id]
        self.state.inbox.results[msg.batch_id] = EvalResult(
            run_id=msg.run_id,
            plan_id=msg.plan_id,
            batch_id=msg.batch_id,
            correct=sum(p.correct for p in parts),
            count=total,
            loss_sum=sum(p.loss_sum for p in parts),
        )


class HybridLiveness(Liveness):
    """Failover inside a stage: a dead device whose stage has others left is not a fault."""

    def __init__(
        self, state: RunState, feedback: Feedback, setup: Setup, estimation: Estimation, planning: Planning
    ) -> None:
        super().__init__(state, estimation, planning)
        self.feedback = feedback
        self.setup = setup
        self.first: FirstStage | None = None  # stage 0's helpers (the central node takes a dead one's rows)

    def _check_liveness(self) -> Fault | None:
        """A dead device of a replicated stage: the survivors take its rows (no fault). Anything else (a
        stage with no device left, late gradients) is the pipeline's fault."""
        self._failover_dead()
        fault = super()._check_liveness()  # also marks devices that missed their heartbeats
        if fault is not None and fault.dead and self._failover_dead():
            return super()._check_liveness()
        return fault

    def _failover_dead(self) -> bool:
        """Fail over the dead devices of stages that have others left; whether there were any."""
        state = self.state
        dead = [
            d for d in state.groups.devices[1:] if (w := state.workers.get(d)) is not None and not w.online
        ]
        orphaned = set(state.groups.orphaned(dead))
        survivable = [d for d in dead if state.groups.stage_of(d) not in orphaned]
        if survivable:
            self._failover(survivable)
        return bool(survivable)

    def _failover(self, dead: list[str]) -> None:
        state = self.state
        detected = state.clock()
        new, changed = state.groups.without(dead)
        if not changed:
            return
        before = list(self.setup.subscribed)
        state.node.senders.see(state.plan_view())  # the members leaving may still deliver this plan's pieces
        state.groups = new
        state.worker_list = new.primaries
        members, shares = new.to_wire()
        state.send(
            state.topics.fixed(Family.COMMAND),
            Reshare(
                run_id=state.run_id,
                plan_id=state.plan_id,
                share_version=new.version,
                worker_list=list(state.worker_list),
                groups=members,
                shares=shares,
            ),
        )
        # A primary died: the last stage's replica topic may move (only what changed, nothing in flight lost).
        after = self.setup.stage_topics()
        for topic in before:
            if topic not in after:
                state.stop_listening(topic)
        for topic in after:
            if topic not in before:
                state.listen(topic)
        self.setup.subscribed = after
        now = time.monotonic()
        for batch in state.sent_at:
            state.sent_at[batch] = now  # the survivors compute those batches again: their timers restart
        batch = self.feedback.next_batch()
        entry = {
            "batch": batch,
            "devices": sorted(dead),
            "stages": changed,
            "detected": round(detected, 4),
            "groups": [list(g) for g in new.members],
            "shares": [list(s) for s in new.shares],
        }
        state.report.failovers.append(entry)
        if 0 in changed and self.first is not None:
            self.first.members_changed()
        log.warning(
            "failover at batch %d: %s stopped; stage(s) %s go on with %s (no rollback)",
            batch,
            sorted(dead),
            changed,
            [list(new.members[k]) for k in changed],
        )
        state.event("failover", batch=batch, devices=sorted(dead), stages=changed, groups=members)
        self.refresh_deadline()


class HybridSwitching(Switching):
    """A switch forgets the pieces of the old plan and starts measuring the new one."""

    def __init__(
        self,
        state: RunState,
        feedback: Feedback,
        setup: Setup,
        planning: Planning,
        liveness: Liveness,
        handling: HybridHandlers,
    ) -> None:
        super().__init__(state, setup, planning, liveness)
        self.feedback = feedback
        self.handling = handling

    def switch_to(self, points: list[int], **kwargs: Any) -> Fault | None:
        state = self.state
        self.handling.grad_pieces.clear()
        self.handling.eval_pieces.clear()
        self.handling.first.clear()
        before, old = self.feedback.measured_step(), (list(state.points), state.groups)
        fault = super().switch_to(points, **kwargs)
        if fault is None:
            # A re-split is measured against the plan before it; a recovery starts afresh.
            measured = before is not None and not kwargs.get("recovery") and state.train_started
            self.feedback.previous = (old[0], old[1], before) if measured and before is not None else None
            self.feedback.plan_started = None
        return fault


class HybridTrainer(Trainer):
    """The pipeline's loop, with the hybrid's plan before training, metrics and measured feedback."""

    planning: HybridPlanning

    def __init__(
        self,
        state: RunState,
        feedback: Feedback,
        setup: Setup,
        estimation: Estimation,
        planning: HybridPlanning,
        liveness: Liveness,
        checkpoints: Checkpoints,
        switching: Switching,
        evaluation: Evaluation,
        recovery: Recovery,
        first: FirstStage,
    ) -> None:
        super().__init__(state, setup, planning, liveness, checkpoints, switching, evaluation, recovery)
        self.feedback = feedback
        self.estimation = estimation
        self.first = first

    def _plan_before_training(self) -> None:
        """The first plan was made before any link was measured (the gradient exchange of a replicated
        stage looked free): plan again with the measured links, and switch before batch 0 if it differs.
        With ``--partition oracle`` the devices' true speeds, with ``dynamic`` equal devices;
        ``uniform`` keeps the first plan (PipeDream's equal split ignores the links too)."""
        state = self.state
        if state.start_version or not state.links or state.config.partition == "uniform":
            return
        devices = [
            state.device_id,
            *sorted(d for d in self.planning.usable() if d != state.device_id),
        ]
        caps = [
            self.planning.true_cap(d) if self.planning.oracle else self.estimation.first_cap(d)
            for d in devices
        ]
        plan = self.planning.solve_hybrid(devices, caps, self.planning.bandwidths(devices))
        groups = self.planning.groups_of(plan, devices)
        if groups.members == state.groups.members and list(plan.points) == state.points:
            return
        what = (
            "the true speeds (oracle)"
            if self.planning.oracle
            else "predicted speeds (h)"
            if state.device_times is not None
            else "equal devices"
        )
        reason = f"the hybrid DP over {what} and the measured links"
        order = Plan(list(plan.points), plan.time, reason, groups.primaries, groups)
        fault = self.switching.admit_joiners(order, 0) or self.switching.switch_to(
            list(plan.points), version=0, workers=groups.primaries, groups=groups
        )
        if fault is not None:
            raise TrainingError(f"before training started: {fault.reason}")
        self.planning.record_partition(0, reason, plan.time)

    def metrics(self) -> dict[str, Any] | None:
        values = super().metrics()
        if values is not None:
            values["groups"] = [list(g) for g in self.state.groups.members]
            values["shares"] = [[round(x, 3) for x in s] for s in self.state.groups.shares]
        return values

    def _tick(self, loop: Any) -> Fault | None:
        first = self.first
        if first.redo_due:  # a helper of stage 0 is gone: the central node takes its rows back
            first.redo(list(range(loop.committed + 1, loop.next_f)), self._batch)
        if first.fault is not None:
            fault, first.fault = first.fault, None
            return fault
        return super()._tick(loop)

    def _forward(self, loop: Any) -> None:
        """Stage 0 replicated: the central node's rows forwarded, the helpers' sent to them."""
        if not self.first.active:
            super()._forward(loop)
            return
        bid = loop.next_f
        x, y = self._batch(bid)
        self.first.forward(bid, x, y, bid // self.state.per_epoch)
        self.state.sent_at[bid] = time.monotonic()
        loop.next_f += 1

    def _backward(self, loop: Any, grad: Gradient | None) -> None:
        bid = loop.committed + 1
        if grad is not None and bid in self.first.batches:
            self.state.sent_at.pop(bid, None)  # its gradients are in: what is left is stage 0's own
            if not self.first.backward_whole(bid, grad, self.liveness.wait_for_messages, self._batch):
                return  # a fault while waiting for the helpers' sums (returned by the next tick)
            state = self.state
            state.stage_times = list(grad.stage_times)
            state.stage_history.append(tuple(grad.stage_times))
            self.liveness.refresh_deadline()
            state.runner.batch_done()
            self._commit(loop, bid, grad.loss, grad.correct)
        else:
            super()._backward(loop, grad)
        failovers = self.state.report.failovers
        if failovers and "resumed" not in failovers[-1]:
            failovers[-1]["resumed"] = round(self.state.clock(), 4)

    def _after_batch(self, done: int, loss: float, correct: int) -> None:
        if self.feedback.plan_started is None:
            self.feedback.plan_started = (self.state.clock(), done)
        super()._after_batch(done, loss, correct)
        self.feedback.check_previous(done)


__all__ = [
    "HybridHandlers",
    "HybridLiveness",
    "HybridPlanning",
    "HybridSwitching",
    "HybridTrainer",
]
