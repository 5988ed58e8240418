"""A hybrid stage member through a failover inside its stage and through a re-split (see
:mod:`edgeagent.modes.pipeline.worker.hybrid`).

The central node's ``Reshare`` says who is left of each stage: the survivors keep every row of every
batch not yet updated here, so they compute those batches again under the new shares from the first one
not updated (:meth:`Failover.on_reshare`), with no rollback and no layer moved. A ``Repartition`` that
leaves this device out does not end its part at once: others may fetch its layers, so it serves them
until the plan is committed. Otherwise the re-split is the pipeline stage's
(:class:`~.repartition.Repartitioning`), with the groups of the new plan adopted at the commit.
"""

from __future__ import annotations

import logging

from edgeagent.modes.pipeline.worker.host import HybridHost
from edgeagent.modes.pipeline.worker.repartition import Repartitioning
from edgeagent.pipeline.groups import Groups
from edgeagent.protocol.commands import Reshare
from edgeagent.protocol.messages import Commit, Message, Repartition
from edgeagent.runtime.role import Handler, Inbound

log = logging.getLogger(__name__)


class Failover:
    """A hybrid member's handling of re-shares and re-splits (see the module doc)."""

    def __init__(self, session: HybridHost, repartitioning: Repartitioning) -> None:
        self.session = session
        self.repartitioning = repartitioning

    def handlers(self) -> dict[type[Message], Handler]:
        return {Reshare: self.on_reshare, Repartition: self.on_repartition, Commit: self.on_commit}

    def on_reshare(self, item: Inbound) -> None:
        session = self.session
        msg, run, hy, worker = item.message, session.run, session.hy, session.worker
        if not isinstance(msg, Reshare) or msg.run_id != run.run_id:
            return  # another run's (or a forged) command
        if msg.plan_id != run.plan_id or msg.share_version <= hy.groups.version:
            return
        try:
            new = Groups.of(msg.worker_list, msg.groups, msg.shares, msg.share_version)
        except ValueError as exc:
            worker.report_error("command", f"reshare: {exc}", run.run_id)
            return
        if new.stage_of(worker.device_id) != run.index or len(new.members) != run.num_stages:
            log.warning(
                "%s: the run goes on without this device (groups %s); leaving run %s",
                worker.device_id,
                [list(g) for g in new.members],
                run.run_id,
            )
            session.end(rejoin=True)
            return
        changed = new.members[run.index] != session.group
        worker.senders.see(session.plan_view())  # the members leaving may still deliver this plan's pieces
        hy.groups = new
        run.worker_list = new.primaries
        session.replicas.sends = session.is_primary
        if changed:
            self._redo()
        session.subscribe_stage()
        log.info(
            "%s: stage %d is now held by %s (shares %s); computing again from batch %d",
            worker.device_id,
            run.index,
            list(session.group),
            [round(x, 3) for x in new.shares[run.index]],
            hy.next_apply,
        )

    def _redo(self) -> None:
        """Compute every batch not yet updated here again, with this member's new rows."""
        run, hy = self.session.run, self.session.hy
        first = hy.next_apply
        for batch_id in range(first, run.next_forward):
            run.stage.forget(batch_id)
            run.runner.outputs.pop(batch_id, None)
            hy.rows.pop(batch_id, None)
        run.next_forward = run.next_backward = first
        run.last = None
        run.runner.step_seconds = 0.0

    def on_repartition(self, item: Inbound) -> None:
        msg = item.message
        assert isinstance(msg, Repartition)
        run, worker = self.session.run, self.session.worker
        if msg.run_id != run.run_id or msg.plan_id <= run.plan_id:
            return
        in_plan = any(worker.device_id in g for g in msg.groups) or worker.device_id in msg.worker_list
        if not in_plan:
            # Not in the new plan, but others may fetch this device's layers: serve until the commit.
            log.info(
                "%s: no stage in plan %d; serving its fetches until the commit",
                worker.device_id,
                msg.plan_id,
            )
            self.session.hy.leaving = msg.plan_id
            return
        self.repartitioning.on_repartition(item)

    def on_commit(self, item: Inbound) -> None:
        session = self.session
        msg, run, hy = item.message, session.run, session.hy
        assert isinstance(msg, Commit)
        if msg.run_id == run.run_id and hy.leaving is not None and msg.plan_id == hy.leaving:
            log.info(
                "%s: plan %d is committed without this device; leaving the run",
                session.worker.device_id,
                msg.plan_id,
            )
            session.end(rejoin=True)
            return
        switch = run.switch if msg.run_id == run.run_id else None
        if switch is None or msg.plan_id != switch.plan_id:
            return
        order = switch.order
        hy.groups = Groups.of(order.worker_list, order.groups, order.shares)
        hy.clear(order.version)
        # The stage is built there (its index may be past the new plan's stages until then): who sends
        # its replicas is set as it subscribes to it (HybridSession.subscribe_stage).
        self.repartitioning.on_commit(item)


__all__ = ["Failover"]
