"""A worker's stage through a re-partition (papers/000 Sec. III-D): the new plan, the layers it fetches
and serves, the commit that builds the new stage.

:class:`Repartitioning` handles ``Repartition``, ``FetchRequest``, ``Weights`` and ``Commit`` for its
session (:class:`~.host.SessionHost`) and says ``Ready`` at each phase ("built", "fetched"). The layers
move through a :class:`~edgeagent.replication.switch.Switch`; the chain replicas this device holds for
the stages before it come in as ``Weights`` too.
"""

from __future__ import annotations

import logging

from edgeagent.errors import TrainingError
from edgeagent.modes.pipeline.worker.host import SessionHost
from edgeagent.protocol.messages import Commit, FetchRequest, Message, Ready, ReadyPhase, Repartition, Weights
from edgeagent.protocol.topics import Family
from edgeagent.replication.switch import Switch
from edgeagent.runtime.role import Handler, Inbound

log = logging.getLogger(__name__)


class Repartitioning:
    """A stage's part in re-partitions and its weight traffic (see the module doc)."""

    def __init__(self, session: SessionHost) -> None:
        self.session = session

    def handlers(self) -> dict[type[Message], Handler]:
        return {
            Repartition: self.on_repartition,
            FetchRequest: self.on_fetch,
            Weights: self.on_weights,
            Commit: self.on_commit,
        }

    def on_repartition(self, item: Inbound) -> None:
        session = self.session
        msg, run, worker = item.message, session.run, session.worker
        assert isinstance(msg, Repartition)
        if msg.run_id != run.run_id or msg.plan_id <= run.plan_id:
            return
        try:
            switch = Switch.start(
                worker.device_id, msg, session.replicas.store, run.stage, run.spec, run.seed
            )
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

    def on_fetch(self, item: Inbound) -> None:
        """Another device moves layers this one holds (live, a snapshot or a replica): send them."""
        msg = item.message
        assert isinstance(msg, FetchRequest)
        if msg.owner == self.session.worker.device_id and msg.run_id == self.session.run.run_id:
            self.session.replicas.serve(msg)

    def on_weights(self, item: Inbound) -> None:
        """A chain replica of a stage before this one, or layers fetched for a re-partition."""
        msg, run = item.message, self.session.run
        assert isinstance(msg, Weights)
        if msg.run_id != run.run_id:
            return
        if msg.purpose in ("chain", "global") and msg.plan_id == run.plan_id:  # global: a paced replica
            self.session.replicas.store.add_replica(msg)
        elif msg.purpose == "redistribute" and run.switch is not None and run.switch.accept(msg):
            self._maybe_fetched()

    def _maybe_fetched(self) -> None:
        if self.session.run.switch is not None and self.session.run.switch.complete:
            self.say_ready("fetched")

    def on_commit(self, item: Inbound) -> None:
        """Every device of the new plan has its layers: build the new stage and go on from there."""
        session = self.session
        msg, run, worker = item.message, session.run, session.worker
        assert isinstance(msg, Commit)
        switch = run.switch if msg.run_id == run.run_id else None
        if switch is None or msg.plan_id != switch.plan_id:
            return
        stage = switch.build(run.spec, run.seed, run.options)
        for holder in switch.plan.fetch:
            topic = worker.topics.device(Family.REPLICA, holder)
            if topic not in run.subscriptions:  # a stage's own subscription follows subscribe_stage
                worker.stop_listening(topic)
        run.adopt(switch, stage)
        session.subscribe_stage()
        session.replicas.replicate_now()
        worker.set_status("training", run_id=run.run_id, stage=run.index)
        self.say_ready("built")

    def say_ready(self, phase: ReadyPhase) -> None:
        run, worker = self.session.run, self.session.worker
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


__all__ = ["Repartitioning"]
