"""The weight copies of a pipeline run on a worker (papers/000 Sec. III-E).

:class:`Replicas` owns the device's :class:`~edgeagent.replication.store.WeightStore` for the run: the
stage's own snapshots, sent as chain replicas to the next stages and as global ones to the central
node at the run's replication points, and the chain replicas this device holds for the stages before
it. A re-partition or a recovery fetches layers from it (:meth:`Replicas.serve`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from edgeagent.protocol.messages import FetchRequest, Weights, WeightsPurpose
from edgeagent.protocol.topics import Family
from edgeagent.protocol.wire import encode
from edgeagent.replication.store import WeightStore, replica_message, snapshots_kept
from edgeagent.replication.switch import serve_fetch

if TYPE_CHECKING:
    from edgeagent.modes.pipeline.worker.run import Run
    from edgeagent.roles.worker.node import Worker


class Replicas:
    """This device's weight store for one run, and the replicas it sends and serves."""

    def __init__(self, worker: Worker, run: Run) -> None:
        self.worker = worker
        self.run = run
        self.store = WeightStore(worker.device_id, keep=snapshots_kept(run.replica_share))
        # Hybrid stages: only a stage's primary sends replicas; its helpers hold the same weights and keep
        # their own snapshots only (to serve a rollback if one of them becomes the primary).
        self.sends = True

    def batch_done(self, batch_id: int) -> None:
        """Replicate if batch ``batch_id`` was the last one before a replication point."""
        run, worker = self.run, self.worker
        done = batch_id + 1
        chain = run.chain_points.due(done)
        full = run.global_every > 0 and done % run.global_every == 0
        if not (chain or full):
            return
        if not self.sends:
            self.store.snapshot(run.stage)
            return
        # Snapshot now, on the training thread (a consistent version); encode and send on the
        # scheduler's thread so that training goes on meanwhile.
        if self.paced:
            for topic, msg in self._messages(chain=chain, full=full, once=True):
                worker.run_soon(self._send_paced, topic, msg)
            return
        for topic, msg in self._messages(chain=chain, full=full):
            worker.run_soon(worker.send, topic, msg)

    @property
    def paced(self) -> bool:
        """Whether replicas take the bulk lane of a slow uplink, emulated or measured (the run's
        ``replica_share``; a real uplink once the central node said ``pace``)."""
        return self.run.replica_share > 0 and getattr(self.worker.transport, "throttle", None) is not None

    def _send_paced(self, topic: str, msg: Weights) -> None:
        """On the bulk lane (:meth:`~edgeagent.transport.base.Transport.publish_bulk`): in the uplink's
        idle time, within the run's share of it; a newer replica of the same purpose replaces one still
        waiting. A chain replica never replaces a global one: the central node checkpoints at global
        points, and a slow link whose globals gave way to every next chain replica would checkpoint no
        more."""
        worker = self.worker
        payload = encode(msg, sender=worker.device_id)
        key = f"{topic}#{msg.purpose}"
        worker.transport.publish_bulk(key, topic, payload, share=self.run.replica_share)
        worker.times.sent_bytes += len(payload)

    def replicate_now(self) -> None:
        """After a new split: snapshots of the old layout cannot restore this one, so start afresh with
        a snapshot of the new stage and send its chain and global replicas before saying "built"
        (the global one shares the reply topic with "built", so the central node has it first)."""
        self.store.clear()
        run = self.run
        self.worker.transport.cancel_bulk()  # replicas of the old layout still waiting are of no use now
        if not self.sends:
            self.store.snapshot(run.stage)
            return
        for topic, msg in self._messages(chain=run.chain_every > 0, full=run.global_every > 0):
            self.worker.send(topic, msg)

    def _messages(self, *, chain: bool, full: bool, once: bool = False) -> list[tuple[str, Weights]]:
        """A snapshot of the stage as its chain replica (to the next stages) and its global one (to the
        central node), with the topic of each. ``once`` (paced replicas): the central node listens to
        every worker's replica topic then, so one message there is both (purpose "global" at a global
        point): the snapshot crosses the uplink once instead of twice."""
        run, worker = self.run, self.worker
        snap = self.store.snapshot(run.stage)
        # Fault injection (--send-nan replica@V): what is sent, never what is kept, carries NaN.
        sent = {k: worker.poisoned("replica", snap.version, t) for k, t in snap.weights.items()}
        if any(sent[k] is not t for k, t in snap.weights.items()):
            snap = dataclasses.replace(snap, weights=sent)
        messages = []
        if once:
            purpose: WeightsPurpose = "global" if full else "chain"
            msg = replica_message(run.run_id, worker.device_id, run.index, snap, purpose, run.plan_id)
            return [(worker.topics.device(Family.REPLICA, worker.device_id), msg)]
        if chain:
            msg = replica_message(run.run_id, worker.device_id, run.index, snap, "chain", run.plan_id)
            messages.append((worker.topics.device(Family.REPLICA, worker.device_id), msg))
        if full:
            msg = replica_message(run.run_id, worker.device_id, run.index, snap, "global", run.plan_id)
            messages.append((worker.topics.device(Family.REPLY, worker.device_id), msg))
        return messages

    def serve(self, request: FetchRequest) -> None:
        """Send the layers another device fetches from this one: live, a snapshot, a replica or the
        seeded start."""
        run, worker = self.run, self.worker
        reply = serve_fetch(self.store, run.stage, request, run.spec, run.seed, run.run_id)
        worker.send(worker.topics.device(Family.REPLICA, worker.device_id), reply)


__all__ = ["Replicas"]
