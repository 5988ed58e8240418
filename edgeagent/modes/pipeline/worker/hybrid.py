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
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Any

import torch

from edgeagent.errors import TrainingError
from edgeagent.modes.pipeline.worker.hybrid_intake import HybridIntake, HybridState
from edgeagent.modes.pipeline.worker.run import Run
from edgeagent.pipeline.groups import Groups, cover
from edgeagent.pipeline.rows import Rows
from edgeagent.pipeline.schedule import Kind, admit, next_kind, stage_bound
from edgeagent.protocol.commands import Reshare
from edgeagent.protocol.identity import PlanView
from edgeagent.protocol.messages import Assign, Commit, EvalResult, GradSync, Message, Repartition
from edgeagent.protocol.topics import Family
from edgeagent.runtime.compute import Clock, emulate_slowdown
from edgeagent.runtime.role import Handler, Inbound

if TYPE_CHECKING:
    from edgeagent.roles.worker.node import Worker

log = logging.getLogger(__name__)


class HybridSession(HybridIntake):
    """One member of a (possibly replicated) stage of a hybrid run (see the module doc)."""

    def __init__(self, worker: Worker, run: Run, groups: Groups) -> None:
        super().__init__(worker, run)
        self.hy = HybridState(groups, next_apply=run.next_backward)
        self.replicas.sends = self._is_primary

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
    def _group(self) -> tuple[str, ...]:
        return self.hy.groups.members[self.run.index]

    @property
    def _is_primary(self) -> bool:
        return self._group[0] == self.worker.device_id

    def _my_rows(self, total: int) -> Rows:
        return self.hy.groups.rows(self.run.index, self.worker.device_id, total)

    # -- subscriptions -------------------------------------------------------------------------

    def _stage_subscriptions(self) -> list[str]:
        wanted = super()._stage_subscriptions()
        if len(self._group) > 1:
            wanted.append(self.worker.topics.stage_filter(Family.SYNC, self.run.index))
        return wanted

    # -- the session's interface -----------------------------------------------------------------

    def plan_view(self) -> PlanView:
        return PlanView(self.run.run_id, self.run.plan_id, self.hy.groups.members)

    def handlers(self) -> dict[type[Message], Handler]:
        return {
            **super().handlers(),
            GradSync: self._on_sync,
            Reshare: self._on_reshare,
        }

    def has_work(self) -> bool:
        return self._next_eval() is not None or self._can_apply() or self._ready() is not None

    def step(self) -> None:
        """An evaluation batch first, then an update that is whole, then 1F1B's next pass."""
        eid = self._next_eval()
        if eid is not None:
            self._evaluate_rows(eid)
            return
        if self._can_apply():
            self._apply()
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
        return buffer.covers(*self._my_rows(buffer.total))

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
        lo, hi = self._my_rows(total)
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
        x, y = cols["x"], cols["y"]
        run.batch_size = hi - lo
        runner = run.runner
        started = Clock()
        run.stage.pin(batch_id, run.stage.version_for(batch_id, asked))
        out, version = run.stage.forward(batch_id, x, asked)
        if run.is_last:
            worker.fault_at_backward(batch_id)
            result = run.stage.backward(batch_id, labels=y, total=total, defer=True)
            run.next_backward = batch_id + 1
            if not math.isfinite(result.loss):
                self._diverged(batch_id, result.loss)
                return
            runner.add_compute(emulate_slowdown(started, worker.slowdown, worker.times))
            runner.batch_done()
            assert result.row_loss is not None and result.row_correct is not None
            self._send_rows_gradient(
                batch_id, result.grad_input, (lo, hi), total, result.row_loss, result.row_correct, {}
            )
            self._contribute(batch_id, (lo, hi), total, result.param_grads or {})
            return
        runner.add_compute(emulate_slowdown(started, worker.slowdown, worker.times))
        activation = runner.activation(
            worker.poisoned("activation", batch_id, out),
            y,
            run_id=run.run_id,
            plan_id=run.plan_id,
            batch_id=batch_id,
            version=version,
            mode="train",
            epoch=batch_id // max(1, run.batches_per_epoch),
        )
        activation = dataclasses.replace(activation, rows=[lo, hi], total=total)
        run.codecs.message_sent(
            worker.send(worker.topics.activations(run.index, worker.device_id), activation)
        )

    def _backward_rows(self, batch_id: int) -> None:
        run, worker, hy = self.run, self.worker, self.hy
        lo, hi = hy.rows.get(batch_id, (0, 0))
        run.next_backward = batch_id + 1
        run.last = "B"
        if hi == lo:
            return
        buffer = hy.grads[batch_id]
        cols = buffer.take(lo, hi)
        run.runner.gradient_arrived(batch_id)
        worker.fault_at_backward(batch_id)
        started = Clock()
        result = run.stage.backward(batch_id, grad_output=cols["g"], defer=True)
        run.runner.add_compute(emulate_slowdown(started, worker.slowdown, worker.times))
        run.runner.batch_done()
        self._send_rows_gradient(
            batch_id,
            result.grad_input,
            (lo, hi),
            buffer.total,
            cols["loss"],
            cols["correct"],
            hy.times.get(batch_id, {}),
        )
        self._contribute(batch_id, (lo, hi), buffer.total, result.param_grads or {})

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
        run, worker = self.run, self.worker
        lo, hi = rows
        if grad is None:
            raise TrainingError(f"stage {run.index} produced no input gradient for batch {batch_id}")
        losses = [float(v) for v in row_loss.tolist()]
        correct = [int(v) for v in row_correct.tolist()]
        # This device's seconds per whole batch (its time over its share of the rows) rides along.
        times = {**downstream_times, worker.device_id: run.runner.per_batch() * total / (hi - lo)}
        gradient = run.runner.gradient(
            worker.poisoned("gradient", batch_id, grad),
            run_id=run.run_id,
            plan_id=run.plan_id,
            batch_id=batch_id,
            loss=sum(losses) / total,
            correct=sum(correct),
            downstream=[],  # a hybrid run's stage times are per device (device_times)
        )
        gradient = dataclasses.replace(
            gradient,
            rows=[lo, hi],
            total=total,
            row_loss=losses,
            row_correct=correct,
            device_times=times,
        )
        run.codecs.message_sent(worker.send(worker.topics.gradients(run.index, worker.device_id), gradient))

    # -- the update: the members' gradients added up -----------------------------------------------

    def _contribute(self, batch_id: int, rows: Rows, total: int, grads: dict[str, torch.Tensor]) -> None:
        run, worker, hy = self.run, self.worker, self.hy
        msg = GradSync(
            run_id=run.run_id,
            plan_id=run.plan_id,
            stage=run.index,
            batch_id=batch_id,
            share_version=hy.groups.version,
            device_id=worker.device_id,
            rows=list(rows),
            total=total,
            grads=grads,
            buffers=self._float_buffers() if len(self._group) > 1 else {},
        )
        hy.syncs.setdefault(batch_id, {}).setdefault(hy.groups.version, {})[worker.device_id] = msg
        if len(self._group) > 1:
            sent = {name: worker.poisoned("sync", batch_id, g) for name, g in grads.items()}
            topic = worker.topics.syncs(run.index, worker.device_id)
            worker.send(topic, dataclasses.replace(msg, grads=sent))

    def _whole(self, batch_id: int) -> list[GradSync] | None:
        """The contributions that make the batch's update whole (one groups version), in row order."""
        for _version, by_device in sorted(self.hy.syncs.get(batch_id, {}).items()):
            pieces = {(m.rows[0], m.rows[1]): m for m in by_device.values()}
            total = next(iter(by_device.values())).total
            tiling = cover(pieces, total)
            if tiling is not None:
                return [pieces[rows] for rows in tiling]
        return None

    def _float_buffers(self) -> dict[str, torch.Tensor]:
        return {
            name: b.detach().clone()
            for name, b in self.run.stage.module.named_buffers()
            if b.is_floating_point()
        }

    def _average_buffers(self, parts: list[GradSync]) -> None:
        """Batch normalisation's running statistics: the row-weighted mean of the members' (each
        normalised only its rows), so every member holds the same."""
        if not all(part.buffers for part in parts) or len(parts) < 2:
            return
        module = self.run.stage.module
        for name, buffer in list(module.named_buffers()):
            if not buffer.is_floating_point():
                continue
            if any(name not in p.buffers or p.buffers[name].shape != buffer.shape for p in parts):
                continue
            mean = torch.zeros_like(buffer)
            for p in parts:
                mean += (p.rows[1] - p.rows[0]) / p.total * p.buffers[name]
            # A new tensor, not copied into the old one: batches in flight saved the old one for their
            # backward pass, and an in-place change would fail autograd's version check.
            owner, _, leaf = name.rpartition(".")
            module.get_submodule(owner)._buffers[leaf] = mean

    def _can_apply(self) -> bool:
        hy = self.hy
        return hy.leaving is None and self.run.switch is None and self._whole(hy.next_apply) is not None

    def _apply(self) -> None:
        run, hy = self.run, self.hy
        batch_id = hy.next_apply
        parts = self._whole(batch_id)
        assert parts is not None
        total: dict[str, torch.Tensor] = {}
        for part in parts:
            for name, g in part.grads.items():
                total[name] = g.clone() if name not in total else total[name] + g
        run.stage.apply_gradients(total)
        self._average_buffers(parts)
        run.stage.forget(batch_id)  # computed again after a failover, but whole already: drop it
        run.stage.unpin(batch_id)
        hy.next_apply = batch_id + 1
        run.next_forward = max(run.next_forward, batch_id + 1)
        run.next_backward = max(run.next_backward, batch_id + 1)
        lo, hi = hy.rows.get(batch_id, (0, 0))
        hy.forget(batch_id)
        run.batches += 1
        run.samples += hi - lo
        self.replicas.batch_done(batch_id)

    # -- evaluation over rows -----------------------------------------------------------------------

    def _next_eval(self) -> int | None:
        hy = self.hy
        for eid, buffer in hy.evals.items():
            if hy.eval_done.get(eid) != hy.groups.version and buffer.covers(*self._my_rows(buffer.total)):
                return eid
        return None

    def _evaluate_rows(self, eid: int) -> None:
        run, worker, hy = self.run, self.worker, self.hy
        buffer = hy.evals[eid]
        hy.eval_done[eid] = hy.groups.version
        lo, hi = self._my_rows(buffer.total)
        if hi == lo:
            return
        worker.fault_at_evaluation(eid)
        cols = buffer.take(lo, hi)
        x, y = cols["x"], cols["y"]
        started = Clock()
        out = run.stage.evaluate(x)
        emulate_slowdown(started, worker.slowdown, worker.times)
        if not run.is_last:
            activation = run.runner.activation(
                out,
                y,
                run_id=run.run_id,
                plan_id=run.plan_id,
                batch_id=eid,
                version=hy.eval_versions.get(eid, 0),
                mode="eval",
                epoch=0,
            )
            activation = dataclasses.replace(activation, rows=[lo, hi], total=buffer.total)
            run.codecs.message_sent(
                worker.send(worker.topics.activations(run.index, worker.device_id), activation)
            )
            return
        result = EvalResult(
            run_id=run.run_id,
            plan_id=run.plan_id,
            batch_id=eid,
            correct=int((out.argmax(dim=1) == y).sum()),
            count=hi - lo,
            loss_sum=float(torch.nn.functional.cross_entropy(out, y, reduction="sum")),
            rows=[lo, hi],
            total=buffer.total,
        )
        worker.send(worker.topics.results(run.index, worker.device_id), result)

    # -- failover inside a stage, re-splits --------------------------------------------------------

    def _on_reshare(self, item: Inbound) -> None:
        msg, run, hy = self._command(item, Reshare), self.run, self.hy
        if msg is None or msg.plan_id != run.plan_id or msg.share_version <= hy.groups.version:
            return
        try:
            new = Groups.of(msg.worker_list, msg.groups, msg.shares, msg.share_version)
        except ValueError as exc:
            self.worker.report_error("command", f"reshare: {exc}", run.run_id)
            return
        if new.stage_of(self.worker.device_id) != run.index or len(new.members) != run.num_stages:
            log.warning(
                "%s: the run goes on without this device (groups %s); leaving run %s",
                self.worker.device_id,
                [list(g) for g in new.members],
                run.run_id,
            )
            self._end(rejoin=True)
            return
        changed = new.members[run.index] != self._group
        self.worker.senders.see(self.plan_view())  # the members leaving may still deliver this plan's pieces
        hy.groups = new
        run.worker_list = new.primaries
        self.replicas.sends = self._is_primary
        if changed:
            self._redo()
        self._subscribe_stage()
        log.info(
            "%s: stage %d is now held by %s (shares %s); computing again from batch %d",
            self.worker.device_id,
            run.index,
            list(self._group),
            [round(x, 3) for x in new.shares[run.index]],
            hy.next_apply,
        )

    def _redo(self) -> None:
        """Compute every batch not yet updated here again, with this member's new rows."""
        run, hy = self.run, self.hy
        first = hy.next_apply
        for batch_id in range(first, run.next_forward):
            run.stage.forget(batch_id)
            run.runner.outputs.pop(batch_id, None)
            hy.rows.pop(batch_id, None)
        run.next_forward = run.next_backward = first
        run.last = None
        run.runner.step_seconds = 0.0

    def _on_repartition(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, Repartition)
        run = self.run
        if msg.run_id != run.run_id or msg.plan_id <= run.plan_id:
            return
        in_plan = (
            any(self.worker.device_id in g for g in msg.groups) or self.worker.device_id in msg.worker_list
        )
        if not in_plan:
            # Not in the new plan, but others may fetch this device's layers: serve until the commit.
            log.info(
                "%s: no stage in plan %d; serving its fetches until the commit",
                self.worker.device_id,
                msg.plan_id,
            )
            self.hy.leaving = msg.plan_id
            return
        super()._on_repartition(item)

    def _on_commit(self, item: Inbound) -> None:
        msg, run, hy = item.message, self.run, self.hy
        assert isinstance(msg, Commit)
        if msg.run_id == run.run_id and hy.leaving is not None and msg.plan_id == hy.leaving:
            log.info(
                "%s: plan %d is committed without this device; leaving the run",
                self.worker.device_id,
                msg.plan_id,
            )
            self._end(rejoin=True)
            return
        switch = run.switch if msg.run_id == run.run_id else None
        if switch is None or msg.plan_id != switch.plan_id:
            return
        order = switch.order
        hy.groups = Groups.of(order.worker_list, order.groups, order.shares)
        hy.clear(order.version)
        self.replicas.sends = self._is_primary
        super()._on_commit(item)


__all__ = ["HybridSession"]
