"""The hybrid mode's half of a run on a worker: one member of a stage that several devices may hold.

A :class:`HybridSession` is a :class:`~.session.PipelineSession` whose stage is held
by a *group* of devices (``Assign.groups``; the primary, ``worker_list[k]``, first). Every batch's rows are
split among the group in proportion to the members' shares (:mod:`edgeagent.pipeline.rows`): each member
forwards and backwards only its rows, the stages before and after see the batch as pieces and collect
them in :class:`~edgeagent.pipeline.rows.RowBuffer` s, and the members add up their parameter gradients
(``GradSync`` on ``stage/<k>/sync``) before every update, so that each member applies the same update
and weight stashing and vertical sync stay exact (:mod:`edgeagent.pipeline.groups`).

Failover inside a stage: the central node's ``Reshare`` says who is left. The survivors keep every row of
every batch not yet updated here (inputs and gradients: they receive all pieces), so they compute the
batches again under the new shares from the first one not updated, with no rollback and no layer
moved. A batch whose update was already whole under the old shares (the dead member's gradients came
through) is applied as it was.

Only the primary sends the stage's replicas (Sec. III-E); helpers keep snapshots of their own.

The session holds its parts as collaborators: the intake of pieces (:mod:`.hybrid_intake`), the
gradient sums and the update (:mod:`.hybrid_update`), failover and re-splits (:mod:`.hybrid_failover`);
what it keeps about the batches not yet updated is a :class:`~.hybrid_state.HybridState`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from edgeagent.modes.pipeline.worker.hybrid_failover import Failover
from edgeagent.modes.pipeline.worker.hybrid_intake import RowIntake
from edgeagent.modes.pipeline.worker.hybrid_state import HybridState
from edgeagent.modes.pipeline.worker.hybrid_update import GroupUpdate
from edgeagent.modes.pipeline.worker.run import Run
from edgeagent.modes.pipeline.worker.session import PipelineSession
from edgeagent.pipeline.groups import Groups
from edgeagent.pipeline.rows import Rows
from edgeagent.pipeline.runner import GradientPiece
from edgeagent.pipeline.schedule import Kind, admit, next_kind, stage_bound
from edgeagent.protocol.identity import PlanView
from edgeagent.protocol.messages import Assign, Message
from edgeagent.protocol.topics import Family
from edgeagent.runtime.role import Handler

if TYPE_CHECKING:
    from edgeagent.roles.worker.node import Worker


class HybridSession(PipelineSession):
    """One member of a (possibly replicated) stage of a hybrid run (see the module doc)."""

    def __init__(self, worker: Worker, run: Run, groups: Groups) -> None:
        super().__init__(worker, run)
        self.hy = HybridState(groups, next_apply=run.next_backward)
        self.replicas.sends = self.is_primary
        self.intake = RowIntake(self)  # pieces of inputs, gradients and the others' gradient sums
        self.update = GroupUpdate(self)  # the members' gradients added up into each batch's update
        self.failover = Failover(self, self.repartitioning)  # re-shares inside the stage, re-splits

    @classmethod
    def open(cls, worker: Worker, msg: Assign) -> HybridSession | None:
        try:
            groups = Groups.of(msg.worker_list, msg.groups, msg.shares, msg.share_version)
        except ValueError as exc:
            worker.report_error("assign", f"bad stage groups: {exc}", msg.run_id)
            return None
        run = cls._build(worker, msg)
        if run is None:
            return None
        worker.leave_run()
        session = cls(worker, run, groups)
        session._start(msg)
        return session

    @classmethod
    def _stage_index(cls, worker: Worker, msg: Assign) -> int | None:
        for k, group in enumerate(msg.groups or [[d] for d in msg.worker_list]):
            if worker.device_id in group:
                return k
        return None

    @property
    def group(self) -> tuple[str, ...]:
        return self.hy.groups.members[self.run.index]

    @property
    def is_primary(self) -> bool:
        return self.group[0] == self.worker.device_id

    def my_rows(self, total: int) -> Rows:
        return self.hy.groups.rows(self.run.index, self.worker.device_id, total)

    # -- subscriptions -------------------------------------------------------------------------

    def _stage_subscriptions(self) -> list[str]:
        if self.run.index == 0:
            # A helper of stage 0: its input rows from the central node, stage 1's gradients, the
            # members' sums; no chain replicas (the central node keeps stage 0's own).
            topics, run = self.worker.topics, self.run
            wanted = [topics.stage_filter(Family.INPUTS, 0), topics.stage_filter(Family.SYNC, 0)]
            if not run.is_last:
                wanted.append(topics.stage_filter(Family.GRADIENTS, 1))
            return wanted
        wanted = super()._stage_subscriptions()
        if len(self.group) > 1:
            wanted.append(self.worker.topics.stage_filter(Family.SYNC, self.run.index))
        return wanted

    def subscribe_stage(self) -> None:
        # The stage or its group changed: only its primary sends replicas (of the stage it holds now).
        self.replicas.sends = self.is_primary
        super().subscribe_stage()
        if self.run.index == 0:
            self.worker.probes.unwatch_all()  # no stage before stage 0: no probes to echo

    # -- the session's interface -----------------------------------------------------------------

    def plan_view(self) -> PlanView:
        return PlanView(self.run.run_id, self.run.plan_id, self.hy.groups.members)

    def handlers(self) -> dict[type[Message], Handler]:
        return {**super().handlers(), **self.intake.handlers(), **self.failover.handlers()}

    def has_work(self) -> bool:
        return self._next_eval() is not None or self.update.can_apply() or self._ready() is not None

    def step(self) -> None:
        """An evaluation batch first, then an update that is whole, then 1F1B's next pass."""
        eid = self._next_eval()
        if eid is not None:
            self._evaluate_rows(eid)
            return
        if self.update.can_apply():
            self.update.apply()
            return
        kind = self._ready()
        if kind == "F":
            self._forward_rows(self.run.next_forward)
        elif kind == "B":
            self._backward_rows(self.run.next_backward)

    def metrics(self) -> dict[str, Any]:
        values = super().metrics()
        # The metrics thread may look while a switch changes the stage: read the groups once.
        groups, me = self.hy.groups, self.worker.device_id
        stage = groups.stage_of(me)
        if stage is not None:
            values["group"] = list(groups.members[stage])
            values["replica"] = groups.members[stage].index(me)
        return values

    # -- 1F1B over rows --------------------------------------------------------------------------

    def _ready(self) -> Kind | None:
        run = self.run
        if run.switch is not None or self.hy.leaving is not None:
            return None
        held = run.next_forward - run.next_backward
        fwd = self._can_forward(run.next_forward) and (
            run.is_last or admit(held, stage_bound(run.in_flight, run.index))
        )
        bwd = (
            (not run.is_last)
            and run.next_backward < run.next_forward
            and self._can_backward(run.next_backward)
        )
        return next_kind(run.last, fwd, bwd)

    def _can_forward(self, batch_id: int) -> bool:
        buffer, asked = self.hy.inputs.get(batch_id), self.hy.versions.get(batch_id)
        if buffer is None or asked is None:
            return False
        stage = self.run.stage
        if not stage.has_version(stage.version_for(batch_id, asked)):
            return False  # a replicated stage's update the batch needs is not whole yet
        return buffer.covers(*self.my_rows(buffer.total))

    def _can_backward(self, batch_id: int) -> bool:
        lo, hi = self.hy.rows.get(batch_id, (0, 0))
        if hi == lo:
            return True
        buffer = self.hy.grads.get(batch_id)
        return buffer is not None and buffer.covers(lo, hi)

    def _forward_rows(self, batch_id: int) -> None:
        run, worker, hy = self.run, self.worker, self.hy
        buffer, asked = hy.inputs[batch_id], hy.versions[batch_id]
        total = buffer.total
        lo, hi = self.my_rows(total)
        run.next_forward = batch_id + 1
        run.last = "F"
        hy.rows[batch_id] = (lo, hi)
        if hy.evals:
            hy.clear_evals()  # training goes on: the evaluation is over
        if hi == lo:  # fewer rows than members: nothing to do here for this batch
            if run.is_last:
                run.next_backward = batch_id + 1
            return
        cols = buffer.take(lo, hi)
        run.batch_size = hi - lo
        run.stage.pin(batch_id, run.stage.version_for(batch_id, asked))
        result = self.stage_step.forward(
            run.runner,
            batch_id,
            cols["x"],
            cols["y"],
            run_id=run.run_id,
            plan_id=run.plan_id,
            slowdown=worker.slowdown,
            epoch=batch_id // max(1, run.batches_per_epoch),
            version=asked,
            rows=[lo, hi],
            total=total,
            defer=True,
        )
        if result is None:
            return  # its rows sent on to the next stage
        run.next_backward = batch_id + 1
        if not math.isfinite(result.loss):
            self._diverged(batch_id, result.loss)
            return
        run.runner.batch_done()
        assert result.row_loss is not None and result.row_correct is not None
        self._send_rows_gradient(
            batch_id, result.grad_input, (lo, hi), total, result.row_loss, result.row_correct, {}
        )
        self.update.contribute(batch_id, (lo, hi), total, result.param_grads or {})

    def _backward_rows(self, batch_id: int) -> None:
        run, worker, hy = self.run, self.worker, self.hy
        lo, hi = hy.rows.get(batch_id, (0, 0))
        run.next_backward = batch_id + 1
        run.last = "B"
        if hi == lo:
            return
        buffer = hy.grads[batch_id]
        cols = buffer.take(lo, hi)
        result = self.stage_step.backward(
            run.runner, batch_id, slowdown=worker.slowdown, grad_output=cols["g"], defer=True
        )
        run.runner.batch_done()
        if run.index == 0:  # a helper of stage 0: no stage before it takes a gradient
            self.update.contribute(batch_id, (lo, hi), buffer.total, result.param_grads or {})
            return
        self._send_rows_gradient(
            batch_id,
            result.grad_input,
            (lo, hi),
            buffer.total,
            cols["loss"],
            cols["correct"],
            hy.times.get(batch_id, {}),
        )
        self.update.contribute(batch_id, (lo, hi), buffer.total, result.param_grads or {})

    def _send_rows_gradient(
        self,
        batch_id: int,
        grad: torch.Tensor | None,
        rows: Rows,
        total: int,
        row_loss: torch.Tensor,
        row_correct: torch.Tensor,
        downstream_times: dict[str, float],
    ) -> None:
        run = self.run
        lo, hi = rows
        losses = [float(v) for v in row_loss.tolist()]
        correct = [int(v) for v in row_correct.tolist()]
        # This device's seconds per whole batch (its time over its share of the rows) rides along.
        times = {**downstream_times, self.worker.device_id: run.runner.per_batch() * total / (hi - lo)}
        self.stage_step.send_gradient(
            run.runner,
            grad,
            run_id=run.run_id,
            plan_id=run.plan_id,
            batch_id=batch_id,
            loss=sum(losses) / total,
            correct=sum(correct),
            downstream=[],  # a hybrid run's stage times are per device (device_times)
            piece=GradientPiece([lo, hi], total, losses, correct, times),
        )

    # -- evaluation over rows -----------------------------------------------------------------------

    def _next_eval(self) -> int | None:
        hy = self.hy
        for eid, buffer in hy.evals.items():
            if hy.eval_done.get(eid) != hy.groups.version and buffer.covers(*self.my_rows(buffer.total)):
                return eid
        return None

    def _evaluate_rows(self, eid: int) -> None:
        run, hy = self.run, self.hy
        buffer = hy.evals[eid]
        hy.eval_done[eid] = hy.groups.version
        lo, hi = self.my_rows(buffer.total)
        if hi == lo:
            return
        cols = buffer.take(lo, hi)
        self.stage_step.evaluate(
            run.runner,
            eid,
            cols["x"],
            cols["y"],
            run_id=run.run_id,
            plan_id=run.plan_id,
            slowdown=self.worker.slowdown,
            version=hy.eval_versions.get(eid, 0),
            rows=[lo, hi],
            total=buffer.total,
        )


__all__ = ["HybridSession"]
