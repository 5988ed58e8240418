"""The hybrid mode's run on the central node: the pipeline run where a stage may be held by several devices.

What differs from :class:`~edgeagent.modes.pipeline.central.trainer.PipelineRun` (papers/000) is here:

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
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from edgeagent.compression import CompressionError
from edgeagent.compression.stage import restore
from edgeagent.errors import PlanningError, TrainingError
from edgeagent.modes.pipeline.central.context import Fault, Plan
from edgeagent.modes.pipeline.central.trainer import PipelineRun
from edgeagent.pipeline.groups import Groups, cover
from edgeagent.pipeline.rows import RowBuffer, gradient_piece
from edgeagent.planner.hybrid import Device, HybridPlan, HybridProblem, predict_hybrid
from edgeagent.planner.hybrid_dp import solve_hybrid
from edgeagent.protocol.commands import Reshare
from edgeagent.protocol.messages import EvalResult, Gradient
from edgeagent.protocol.topics import Family
from edgeagent.runtime.role import Inbound

log = logging.getLogger("edgeagent.roles.central")

RESPLIT_GAIN = 0.05  # a new hybrid plan must be this much faster (predicted) than the current one
# After a re-split, the new plan's step is measured over this many batches; if it is this much slower
# than the plan before it measured, the run goes back to that plan and never picks the new one again.
MEASURE_BATCHES = 20
REVERT_MARGIN = 0.10
MIN_NORMALISED_ROWS = 8  # rows of a batch per member of a replicated stage, at least, with batch norm


class HybridRun(PipelineRun):
    """One run of the hybrid mode on the central node (see the module doc)."""

    MODE = "hybrid"

    # -- the plan ------------------------------------------------------------------------------------

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Set before the run state is built: its constructor asks for the first plan (initial_points).
        self.device_caps: dict[str, float] = {}  # measured capacity of every device (per whole batch)
        self.grad_pieces: dict[int, tuple[RowBuffer, dict[str, float]]] = {}
        self.eval_pieces: dict[int, dict[tuple[int, int], EvalResult]] = {}
        # Measured feedback on re-splits: when the current plan started (training clock, first batch),
        # the plan before it with its measured step, and plans measured slower than their predecessor.
        self.plan_started: tuple[float, int] | None = None
        self.previous: tuple[list[int], Groups, float] | None = None
        self.rejected: set[tuple[tuple[int, ...], tuple[tuple[str, ...], ...]]] = set()
        super().__init__(*args, **kwargs)

    @property
    def oracle(self) -> bool:
        return self.config.partition == "oracle"

    def initial_points(self) -> list[int]:
        """The first plan over every discovered device: equal devices, or the true speeds (oracle)."""
        devices = list(self.worker_list)
        caps = [self._true_cap(d) if self.oracle else self._first_cap(d) for d in devices]
        plan = self._solve_hybrid(devices, caps, [math.inf] * len(devices))
        self._adopt_plan(plan, devices)
        return list(plan.points)

    def _true_cap(self, device: str) -> float:
        if device == self.device_id:
            return self.config.slowdown
        w = self.workers.get(device)
        return w.slowdown if w is not None else 1.0

    def _solve_hybrid(self, devices: list[str], caps: list[float], bandwidths: list[float]) -> HybridPlan:
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
        latency = max((lk.latency for lk in self.links), default=0.0)
        return HybridProblem(
            layer_times=tuple(self.profile.seconds),
            output_bytes=tuple(self.profile.output_bytes),
            devices=tuple(
                Device(
                    capacity=c,
                    bandwidth=b,
                    latency=latency if k else 0.0,
                    memory_limit=(self._limit_of(d) or None) if k else None,
                )
                for k, (d, c, b) in enumerate(zip(devices, caps, bandwidths, strict=True))
            ),
            param_bytes=self.param_bytes,
            in_flight=self.train.in_flight,
            activation_factor=self._comm_factor(len(self.worker_list)),
            max_replicas=self.config.max_replicas,
            min_share=self._min_share(),
        )

    def _min_share(self) -> float:
        """No member of a replicated stage gets fewer than ``MIN_NORMALISED_ROWS`` rows of a batch when
        the model normalises its batches (statistics of 3 rows are noise: training stalls)."""
        if not self.normalises:
            return 0.0
        return min(1.0, MIN_NORMALISED_ROWS / max(1, self.train.batch_size))

    def _adopt_plan(self, plan: HybridPlan, devices: list[str]) -> None:
        groups = self._groups_of(plan, devices)
        self.groups = groups
        self.worker_list = groups.primaries
        left_out = [d for d in devices if d not in groups.devices]
        log.info(
            "hybrid plan: layers %s held by %s%s (predicted %.1f ms per batch)",
            list(plan.points),
            [list(g) for g in groups.members],
            f"; left out: {left_out}" if left_out else "",
            1e3 * plan.time,
        )

    def _plan_before_training(self) -> None:
        """The first plan was made before any link was measured (the gradient exchange of a replicated
        stage looked free): plan again with the measured links, and switch before batch 0 if it differs.
        With ``--partition oracle`` the devices' true speeds, with ``dynamic`` equal devices;
        ``uniform`` keeps the first plan (PipeDream's equal split ignores the links too)."""
        if self.start_version or not self.links or self.config.partition == "uniform":
            return
        devices = [self.device_id, *sorted(d for d in self._usable() if d != self.device_id)]
        caps = [self._true_cap(d) if self.oracle else self._first_cap(d) for d in devices]
        plan = self._solve_hybrid(devices, caps, self._bandwidths(devices))
        groups = self._groups_of(plan, devices)
        if groups.members == self.groups.members and list(plan.points) == self.points:
            return
        what = (
            "the true speeds (oracle)"
            if self.oracle
            else "predicted speeds (h)"
            if self.device_times is not None
            else "equal devices"
        )
        reason = f"the hybrid DP over {what} and the measured links"
        order = Plan(list(plan.points), plan.time, reason, groups.primaries, groups)
        fault = self._admit_joiners(order, 0) or self._switch_to(
            list(plan.points), version=0, workers=groups.primaries, groups=groups
        )
        if fault is not None:
            raise TrainingError(f"before training started: {fault.reason}")
        self._record_partition(0, reason, plan.time)

    def _bandwidths(self, devices: list[str]) -> list[float]:
        """Each device's link to the broker for the DP: the slowest measured stage link (links are
        measured between consecutive stages, not per device; the central node is the broker's host)."""
        slowest = min((lk.bandwidth for lk in self.links), default=math.inf)
        return [math.inf, *[slowest] * (len(devices) - 1)]

    def _groups_of(self, plan: HybridPlan, devices: list[str]) -> Groups:
        return Groups(
            tuple(tuple(devices[d] for d in group) for group in plan.groups), plan.shares, self.groups.version
        )

    def _build_workers(self) -> None:
        """Every device of every stage builds its stage (helpers too)."""
        for device in self.groups.devices[1:]:
            self._assign(
                device, weights=self.initial, momentum=self.initial_momentum, committed=self.start_version - 1
            )
        self.store.snapshot(self.stage)
        self._subscribe_stage()
        self._wait_ready(self.plan_id, "built", set(self.groups.devices[1:]))

    def _record_partition(self, batch: int, reason: str, predicted: float | None = None) -> None:
        if batch == self.start_version and not self.report.partitions and not self.resume:
            reason = (
                "initial: the hybrid DP fed the true speeds (oracle), links not measured yet"
                if self.oracle
                else "initial: the hybrid DP over equal devices, links not measured yet"
            )
        super()._record_partition(batch, reason, predicted)
        self.report.partitions[-1]["groups"] = [list(g) for g in self.groups.members]
        self.report.partitions[-1]["shares"] = [list(s) for s in self.groups.shares]

    def metrics(self) -> dict[str, Any] | None:
        values = super().metrics()
        if values is not None:
            values["groups"] = [list(g) for g in self.groups.members]
            values["shares"] = [[round(x, 3) for x in s] for s in self.groups.shares]
        return values

    # -- measured speeds and the re-split job ---------------------------------------------------------

    def _stage_work(self, device: str) -> float:
        k = self.groups.stage_of(device)
        if k is None:
            return 0.0
        return sum(self.profile.seconds[self.points[k] : self.points[k + 1]])

    def _note_device_times(self, times: dict[str, float]) -> None:
        """Each device's capacity from its seconds per whole batch (papers/000 eq. 1-3, per device)."""
        for device, seconds in times.items():
            work = self._stage_work(device)
            if work > 0 and seconds > 0:
                self.device_caps[device] = seconds / work
        group_times = []
        for group in self.groups.members[1:]:
            known = [times[d] for d in group if times.get(d, 0) > 0]
            group_times.append(1.0 / sum(1.0 / t for t in known) if len(known) == len(group) else 0.0)
        if all(group_times):
            self.stage_times = group_times

    def _start_planning(self, done: int) -> None:
        """The hybrid DP over every device the run may use, from measured capacities where known (after
        ``done`` batches)."""
        caps = self._measured_capacities()
        if caps is None or self.plan_job is not None:
            return
        own = sum(self.runner.recent) / max(1, len(self.runner.recent))
        work0 = sum(self.profile.seconds[self.points[0] : self.points[1]])
        if work0 > 0 and own > 0:
            self.device_caps[self.device_id] = own / work0
        devices = [self.device_id, *sorted(d for d in self._usable() if d != self.device_id)]
        known = [c for d, c in self.device_caps.items() if d != self.device_id] or [1.0]
        mean = sum(known) / len(known)
        device_caps = [self.device_caps.get(d, mean) for d in devices]
        bandwidths = self._bandwidths(devices)
        current = self._current_time(devices, device_caps, bandwidths)
        job: Future[Plan] = Future()

        def run() -> None:
            try:
                plan = self._solve_hybrid(devices, device_caps, bandwidths)
                groups = self._groups_of(plan, devices)
                moving = groups.members != self.groups.members or list(plan.points) != self.points
                if moving and _key(list(plan.points), groups) in self.rejected:
                    groups, points = self.groups, list(self.points)
                    reason = "kept: the hybrid DP's plan was measured slower than this one before"
                    job.set_result(Plan(points, current, reason, groups.primaries, groups))
                    return
                # A switch drains the pipeline and moves layers: only for a clear gain (5 %).
                if moving and not plan.time < (1 - RESPLIT_GAIN) * current:
                    groups, points = self.groups, list(self.points)
                    reason = (
                        f"kept: the hybrid DP's plan would gain {1e3 * (current - plan.time):.1f} ms/batch"
                    )
                    job.set_result(Plan(points, current, reason, groups.primaries, groups))
                    return
                reason = f"hybrid DP: {1e3 * current:.1f} -> {1e3 * plan.time:.1f} ms/batch predicted"
                job.set_result(Plan(list(plan.points), plan.time, reason, groups.primaries, groups))
            except Exception as exc:  # a planning bug must not stop training: keep the split
                job.set_exception(exc)

        if self.node.background(run, f"plan-{self.plan_id}"):
            self.plan_job = job

    def _current_time(self, devices: list[str], caps: list[float], bandwidths: list[float]) -> float:
        """The predicted seconds per batch of the current plan under the same model as the new one."""
        index = {d: k for k, d in enumerate(devices)}
        try:
            groups = [tuple(sorted(index[d] for d in g)) for g in self.groups.members]
            problem = replace(self._hybrid_problem(devices, caps, bandwidths), min_share=0.0)
            return predict_hybrid(problem, self.points, groups)
        except (KeyError, ValueError):
            return math.inf

    def _usable(self) -> list[str]:
        """Devices the next plan may use: the live devices of the run, those it left out, joiners."""
        live = [d for d, w in self.workers.items() if w.online]
        return list(dict.fromkeys([*live, *self.joiners]))

    # -- pieces: the gradients of stage 1's devices, the evaluation results of the last stage's ------

    def on_gradient(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, Gradient)
        if not self._ours(msg) or msg.plan_id != self.plan_id:
            return
        problem = self._take_piece(msg)
        if problem is not None:
            self.node.discard(item, f"gradient of batch {msg.batch_id}: {problem}")

    def _take_piece(self, msg: Gradient) -> str | None:
        expected = self.runner.outputs.get(msg.batch_id)
        if expected is None:
            return None  # committed already (a piece computed again after a failover), or stale
        try:
            g = restore(msg.g)
        except CompressionError as exc:
            return str(exc)
        shape, dtype = expected
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
            self._note_device_times(times)
            whole = buffer.take(0, total)
            self.inbox.gradients[msg.batch_id] = Gradient(
                run_id=msg.run_id,
                plan_id=msg.plan_id,
                stage=msg.stage,
                batch_id=msg.batch_id,
                g=whole["g"],
                loss=float(whole["loss"].sum()) / total,
                correct=int(whole["correct"].sum()),
                stage_times=list(self.stage_times),
                device_times=times,
            )
        return None

    def _take_result(self, msg: EvalResult) -> None:
        """The last stage's devices each send the result of their rows: a batch's result is whole once
        pieces tile its rows (after a failover, pieces of two splits may be there)."""
        if msg.batch_id in self.inbox.results:
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
        self.inbox.results[msg.batch_id] = EvalResult(
            run_id=msg.run_id,
            plan_id=msg.plan_id,
            batch_id=msg.batch_id,
            correct=sum(p.correct for p in parts),
            count=total,
            loss_sum=sum(p.loss_sum for p in parts),
        )

    # -- failover inside a stage -------------------------------------------------------------------

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
        dead = [d for d in self.groups.devices[1:] if (w := self.workers.get(d)) is not None and not w.online]
        orphaned = set(self.groups.orphaned(dead))
        survivable = [d for d in dead if self.groups.stage_of(d) not in orphaned]
        if survivable:
            self._failover(survivable)
        return bool(survivable)

    def _failover(self, dead: list[str]) -> None:
        detected = self.clock()
        new, changed = self.groups.without(dead)
        if not changed:
            return
        before = self._stage_topics()
        self.node.senders.see(self.plan_view())  # the members leaving may still deliver this plan's pieces
        self.groups = new
        self.worker_list = new.primaries
        members, shares = new.to_wire()
        self.send(
            self.topics.fixed(Family.COMMAND),
            Reshare(
                run_id=self.run_id,
                plan_id=self.plan_id,
                share_version=new.version,
                worker_list=list(self.worker_list),
                groups=members,
                shares=shares,
            ),
        )
        # A primary died: the last stage's replica topic may move (only what changed, nothing in flight lost).
        after = self._stage_topics()
        for topic in before:
            if topic not in after:
                self.stop_listening(topic)
        for topic in after:
            if topic not in before:
                self.listen(topic)
        now = time.monotonic()
        for batch in self.sent_at:
            self.sent_at[batch] = now  # the survivors compute those batches again: their timers restart
        batch = self._next_batch()
        entry = {
            "batch": batch,
            "devices": sorted(dead),
            "stages": changed,
            "detected": round(detected, 4),
            "groups": [list(g) for g in new.members],
            "shares": [list(s) for s in new.shares],
        }
        self.report.failovers.append(entry)
        log.warning(
            "failover at batch %d: %s stopped; stage(s) %s go on with %s (no rollback)",
            batch,
            sorted(dead),
            changed,
            [list(new.members[k]) for k in changed],
        )
        self.event("failover", batch=batch, devices=sorted(dead), stages=changed, groups=members)
        self._refresh_deadline()

    def _backward(self, loop: Any, grad: Gradient | None) -> None:
        super()._backward(loop, grad)
        failovers = self.report.failovers
        if failovers and "resumed" not in failovers[-1]:
            failovers[-1]["resumed"] = round(self.clock(), 4)

    def _switch_to(self, points: list[int], **kwargs: Any) -> Fault | None:
        self.grad_pieces.clear()
        self.eval_pieces.clear()
        before, old = self._measured_step(), (list(self.points), self.groups)
        fault = super()._switch_to(points, **kwargs)
        if fault is None:
            # A re-split is measured against the plan before it; a recovery starts afresh.
            measured = before is not None and not kwargs.get("recovery") and self.train_started
            self.previous = (old[0], old[1], before) if measured and before is not None else None
            self.plan_started = None
        return fault

    # -- measured feedback on re-splits ------------------------------------------------------------

    def _next_batch(self) -> int:
        """The next batch to commit (the timeline repeats replayed batches after a rollback)."""
        timeline = self.report.timeline
        return int(timeline[-1]["batch"]) + 1 if timeline else self.start_version

    def _measured_step(self) -> float | None:
        """Training seconds per batch of the current plan since it started (None before 5 batches)."""
        if self.plan_started is None:
            return None
        started, first = self.plan_started
        done = self._next_batch() - first
        return (self.clock() - started) / done if done >= 5 else None

    def _after_batch(self, done: int, loss: float, correct: int) -> None:
        if self.plan_started is None:
            self.plan_started = (self.clock(), done)
        super()._after_batch(done, loss, correct)
        self._check_previous(done)

    def _check_previous(self, done: int) -> None:
        """``MEASURE_BATCHES`` after a re-split: back to the plan before if the new one measures slower."""
        if self.previous is None or self.plan_job is not None or self.plan_started is None:
            return
        if done - self.plan_started[1] < MEASURE_BATCHES or done >= self.total:
            return
        points, groups, before = self.previous
        self.previous = None
        measured = self._measured_step()
        alive = all((w := self.workers.get(d)) is None or w.online for d in groups.devices[1:])
        slower = measured is not None and measured > (1 + REVERT_MARGIN) * before
        if not slower or not alive or _key(points, groups) in self.rejected:
            return
        assert measured is not None
        self.rejected.add(_key(self.points, self.groups))
        reason = (
            f"back to the plan before: the re-split measured {1e3 * measured:.1f} ms/batch, the plan "
            f"before {1e3 * before:.1f}"
        )
        log.warning("%s", reason)
        job: Future[Plan] = Future()
        job.set_result(Plan(points, before, reason, groups.primaries, groups))
        self.plan_job = job


def _key(points: list[int], groups: Groups) -> tuple[tuple[int, ...], tuple[tuple[str, ...], ...]]:
    return tuple(points), groups.members


__all__ = ["HybridRun"]
