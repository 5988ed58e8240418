"""The run's commands to a worker's pipeline stage: stop, collect the weights, ping, measure a link, set
the compression (see :mod:`edgeagent.protocol.commands`).

:class:`RunCommands` answers them for its session (:class:`~.host.SessionHost`); the session installs
its handlers. Each command belongs to one run: another run's (or a forged one's) is ignored.
"""

from __future__ import annotations

import logging
from typing import TypeVar

from edgeagent.compression.stage import NONE
from edgeagent.modes.pipeline.worker.host import SessionHost
from edgeagent.protocol.commands import (
    Collect,
    Command,
    MeasureLink,
    PaceReplicas,
    Ping,
    Resend,
    SetCompression,
    SetReplication,
    Stop,
)
from edgeagent.protocol.messages import Message, Ready, Weights
from edgeagent.protocol.topics import Family
from edgeagent.replication.store import snapshots_kept
from edgeagent.runtime.role import Handler, Inbound

log = logging.getLogger(__name__)

C = TypeVar("C", bound=Command)


class RunCommands:
    """The handlers of the run's commands on a worker's stage (see the module doc)."""

    def __init__(self, session: SessionHost) -> None:
        self.session = session

    def handlers(self) -> dict[type[Message], Handler]:
        return {
            Stop: self.on_stop,
            Collect: self.on_collect,
            SetCompression: self.on_set_compression,
            SetReplication: self.on_set_replication,
            Ping: self.on_ping,
            Resend: self.on_resend,
            MeasureLink: self.on_measure_link,
            PaceReplicas: self.on_pace_replicas,
        }

    def command(self, item: Inbound, kind: type[C]) -> C | None:
        """``item``'s command if it belongs to this run: another run's (or a forged one's) is not ours."""
        msg = item.message
        return msg if isinstance(msg, kind) and msg.run_id == self.session.run.run_id else None

    def on_stop(self, item: Inbound) -> None:
        if self.command(item, Stop) is not None:
            self.session.end()

    def on_collect(self, item: Inbound) -> None:
        """Send the stage's weights to the central node (the trained model)."""
        if self.command(item, Collect) is None:
            return
        run, worker = self.session.run, self.session.worker
        stage = run.stage
        module = stage.module
        weights = Weights(
            run_id=run.run_id, device_id=worker.device_id, stage=run.index, start=module.start,
            end=module.end, version=stage.version, tensors=stage.state(), purpose="collect",
        )  # fmt: skip
        worker.send(worker.topics.device(Family.REPLY, worker.device_id), weights)

    def on_ping(self, item: Inbound) -> None:
        """Say this device is alive, and which weight versions it holds (a recovery's probe)."""
        if self.command(item, Ping) is None:
            return
        run, worker = self.session.run, self.session.worker
        worker.send(
            worker.topics.device(Family.REPLY, worker.device_id),
            Ready(
                run_id=run.run_id,
                plan_id=run.plan_id,
                device_id=worker.device_id,
                stage=run.index,
                parameters=0,
                phase="alive",
                holdings=self.session.replicas.store.holdings(),
            ),
        )

    def on_resend(self, item: Inbound) -> None:
        """A recovery without a rollback replays the dead stage next to this one from what this stage sent
        it (pipeline/catchup.py). The stage after it sends its gradients again once every batch it sent on
        came back (no stage after it is then ahead of it); it drops the dead stage's outputs still queued
        here (training resumes at its version, so they are computed again; computing them now would only
        make the replay longer). The stage before it sends its activations again and takes the dead
        stage's gradients from the central node."""
        msg, session = self.command(item, Resend), self.session
        run, worker = session.run, session.worker
        if msg is None or msg.device != worker.device_id or msg.plan_id != run.plan_id:
            return
        if msg.kind == "activations":
            run.stand_in = True
            topic = worker.topics.activations(run.index, worker.device_id)
            acts = run.runner.sent_activations
            for batch_id in sorted(b for b in acts if b >= msg.since):
                worker.send(topic, acts[batch_id])
            self._say_resent(sent=max(acts, default=-1) + 1)
            return
        run.forwards.clear()
        run.resend = msg
        self.resend_when_drained()

    def resend_when_drained(self) -> None:
        """Resend the gradients :meth:`on_resend` asked for once every batch sent on came back."""
        run, worker = self.session.run, self.session.worker
        msg = run.resend
        if msg is None or run.next_forward != run.next_backward:
            return
        run.resend = None
        topic = worker.topics.gradients(run.index, worker.device_id)
        sent = run.runner.sent_gradients
        for batch_id in sorted(b for b in sent if b >= msg.since):
            worker.send(topic, sent[batch_id])
        self._say_resent()

    def _say_resent(self, sent: int = -1) -> None:
        run, worker = self.session.run, self.session.worker
        worker.send(
            worker.topics.device(Family.REPLY, worker.device_id),
            Ready(
                run_id=run.run_id, plan_id=run.plan_id, device_id=worker.device_id, stage=run.index,
                parameters=0, phase="resent", version=run.stage.version, sent=sent,
            ),
        )  # fmt: skip

    def on_measure_link(self, item: Inbound) -> None:
        msg = self.command(item, MeasureLink)
        worker = self.session.worker
        if msg is not None and msg.source == worker.device_id:
            worker.measure_link(self.session.run.run_id, msg.target)

    def on_set_replication(self, item: Inbound) -> None:
        """ResPipe's T retuned to the measured rate: chain replicas every ``chain_every`` batches from
        ``from_batch`` on (another plan's command is stale: the plan's order carries its own period)."""
        msg, run = self.command(item, SetReplication), self.session.run
        if msg is None or msg.plan_id != run.plan_id:
            return
        run.chain_every = msg.chain_every
        run.chain_points = run.chain_points.then(msg.chain_every, msg.from_batch)

    def on_pace_replicas(self, item: Inbound) -> None:
        """Replicas paced from now on (the central node measured a slow real uplink): this device's, on
        its uplink's measured rate if it is one of them; every device keeps the snapshots they need."""
        msg = self.command(item, PaceReplicas)
        if msg is None:
            return
        session = self.session
        worker = session.worker
        session.run.replica_share = msg.share
        session.replicas.store.keep = snapshots_kept(msg.share)
        mbps = msg.uplinks.get(worker.device_id)
        if mbps is not None and worker.transport.pace_uplink(mbps):
            log.info(
                "%s: replicas paced in the idle time of this device's uplink (measured %.2f Mbit/s), "
                "at most %.0f %% of it",
                worker.device_id,
                mbps,
                100 * msg.share,
            )

    def on_set_compression(self, item: Inbound) -> None:
        msg, run = self.command(item, SetCompression), self.session.run
        if msg is None:
            return
        if msg.plan_id != run.plan_id:
            if msg.plan_id > run.plan_id and run.switch is None:
                # The central node moved on to a plan without this device (it took it for dead).
                log.warning(
                    "%s: the run went on to plan %d without this device; leaving run %s",
                    self.session.worker.device_id,
                    msg.plan_id,
                    run.run_id,
                )
                self.session.end(rejoin=True)
            return
        if len(msg.forward) != run.num_stages:
            self.session.worker.report_error(
                "command", f"compression for {len(msg.forward)} stages, the run has {run.num_stages}"
            )
            return
        run.run_bits = msg.forward[run.index]
        run.codecs.set_bits(self.forward_bits(run.run_bits), msg.backward[run.index])

    def profile_changed(self) -> None:
        """A profile may override the bits of this device's outgoing activations."""
        codecs = self.session.run.codecs
        codecs.set_bits(self.forward_bits(self.session.run.run_bits), codecs.backward_bits)

    def forward_bits(self, run_choice: int) -> int:
        """The bits of this device's outgoing activations: its profile's override, or the run's."""
        profile = self.session.worker.profile
        override = profile.compression if profile else "run"
        if override == "run":
            return run_choice
        return NONE if override == "none" else int(override)


__all__ = ["RunCommands"]
