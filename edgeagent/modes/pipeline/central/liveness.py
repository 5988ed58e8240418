"""Liveness and deadlines (papers/000 Sec. III-F): faults are detected here and returned as values; every
deadline follows the measured step (planner/deadlines.py)."""

from __future__ import annotations

import logging
import math
import time

from edgeagent.modes.pipeline.central.context import Fault, RunState
from edgeagent.modes.pipeline.central.estimation import Estimation
from edgeagent.modes.pipeline.central.planning import Planning
from edgeagent.planner.deadlines import silence
from edgeagent.planner.dp import Link, compute_time, predict

log = logging.getLogger("edgeagent.roles.central")


class Liveness:
    """Is the pipeline alive, and how long may the next gradient, result or probe answer take?"""

    def __init__(self, state: RunState, estimation: Estimation, planning: Planning) -> None:
        self.state = state
        self.estimation = estimation
        self.planning = planning

    def wait_for_messages(self, *, next_batch: int | None = None) -> Fault | None:
        """Block for the next message; meanwhile check that the pipeline is alive.

        Everything queued is handled before the check, and if the gradients of ``next_batch`` (the oldest
        batch in flight) are in, the check waits for the next round: work that arrived before a fault
        (the gradients a worker sent just before it died; its last will is stamped on arrival, on the
        network thread, while they may still wait in the inbox) is done first, so the fault is recorded
        at the first batch whose gradients really are missing (Sec. III-F).
        """
        self.state.node.pump(0.5)
        if next_batch is not None and next_batch in self.state.inbox.gradients:
            return None
        return self._check_liveness()

    def _check_liveness(self) -> Fault | None:
        """Detect faults (Sec. III-F): a batch whose gradients are late, missed heartbeats, a last will."""
        state = self.state
        now = time.monotonic()
        own = state.config.heartbeat_interval
        if not state.node.transport.connected:
            # Our own link to the broker is down: nobody can be judged by heartbeats meanwhile.
            state.grace_until = now + 3 * own
            return None
        if now < state.grace_until:
            for w in state.workers.values():
                w.last_heartbeat = max(w.last_heartbeat, now - max(own, w.heartbeat_interval))
        slack = self._transfer_slack()
        for w in state.workers.values():
            # Each device by its own heartbeat interval (a profile may set up to 60 s), never ours.
            limit = silence(w.heartbeat_interval, floor=own, slack=slack)
            if w.online and now - w.last_heartbeat > limit:
                w.online = False
                log.warning(
                    "worker %s missed heartbeats for %.1f s (it beats every %.1f s)",
                    w.device_id,
                    now - w.last_heartbeat,
                    max(own, w.heartbeat_interval),
                )
        dead = [
            w.device_id for w in state.workers.values() if not w.online and w.device_id in state.worker_list
        ]
        # While a device measures its h (ask_h), its stage and so every batch in flight waits for it.
        stalled = self.estimation.measuring_until(now) > now
        late = [b for b, sent in state.sent_at.items() if now - sent > state.batch_deadline and not stalled][
            :1
        ]
        if dead or late:
            reason = (
                f"worker(s) {dead} stopped"
                if dead
                else f"gradients of batch {late[0]} are late (timer {state.batch_deadline:.1f} s)"
            )
            return Fault(dead, reason)
        return None

    def _capacity_estimates(self) -> list[float]:
        """Every stage's capacity: measured where it ran (the latest window), else assumed slow.

        A device that has not run a batch yet may be a Pi: it is taken as ``unmeasured_slowdown`` times
        slower than the central node (times its announced emulated slowdown): the first batch's timer is
        generous, and from the first gradients on the measured times count.
        """
        state = self.state
        measured = self.planning.measured_capacities()
        if measured is not None:
            state.known_caps.update(zip(state.worker_list, measured, strict=True))
        caps = []
        for device in state.worker_list:
            known = state.known_caps.get(device)
            if known is None and device == state.device_id:
                known = state.config.slowdown
            elif known is None:
                w = state.workers.get(device)
                known = (w.slowdown if w else 1.0) * state.config.unmeasured_slowdown
            caps.append(known)
        return caps

    def _predicted_step(self) -> tuple[float, float]:
        """(seconds per batch of the current split, seconds of its slowest stage's compute)."""
        state = self.state
        caps = self._capacity_estimates()
        n = len(caps)
        # Before the links are measured (set-up), only compute counts.
        links = state.links if len(state.links) == n - 1 else [Link(math.inf)] * (n - 1)
        problem = self.planning.problem(caps, links=links)
        slowest = max(compute_time(problem, k, state.points[k], state.points[k + 1]) for k in range(n))
        return predict(problem, state.points), slowest

    def refresh_deadline(self) -> None:
        """The batch timer of Sec. III-F from the measured step (after every gradient, split and fault)."""
        state = self.state
        step, _ = self._predicted_step()
        state.batch_deadline = state.deadlines.batch(
            step, stages=len(state.worker_list), bound=state.bound(), queued=self._replica_slack()
        )

    def eval_deadline(self) -> float:
        state = self.state
        step, _ = self._predicted_step()
        return state.deadlines.evaluation(
            step,
            stages=len(state.worker_list),
            bound=self.eval_bound(),
            eval_batch=state.train.eval_batch_size,
            train_batch=state.train.batch_size,
        )

    def probe_window(self) -> float:
        """How long live devices may take to answer the probe: their slowest step and a round trip."""
        _, slowest = self._predicted_step()
        round_trip = 2 * max((lk.latency for lk in self.state.links), default=0.0) + self._transfer_slack()
        return self.state.deadlines.probe(slowest, round_trip)

    def barrier(self, nbytes: float) -> float:
        """How long a mid-run barrier that moves ``nbytes`` may take: over the slowest measured link (any
        link may carry them; the last device's uplink is not measured), after the replica traffic that
        may be queued on it (planner/deadlines.py)."""
        slowest = self._slowest_link()
        return self.state.deadlines.barrier(
            nbytes, slowest.bandwidth, latency=slowest.latency, queued=self._replica_slack()
        )

    def _slowest_link(self) -> Link:
        """The slowest measured link: of the pipeline, or a device's uplink (the last stage's)."""
        measured = [*self.state.links, *self.state.uplinks.values()]
        return min(measured, key=lambda lk: lk.bandwidth, default=Link(math.inf))

    def replica_bytes(self, points: list[int]) -> int:
        """Bytes a device sends before it says "built" on the split ``points``: the chain and global
        replicas (weights and momentum) of the largest stage."""
        state = self.state
        copies = int(state.chain_every > 0) + int(state.config.global_every > 0)
        params = state.param_bytes
        stages = [sum(params[points[k] : points[k + 1]]) for k in range(len(points) - 1)]
        return copies * 2 * max(stages, default=0)

    def _transfer_slack(self) -> float:
        """How long a worker's uplink may be busy before its next message (a heartbeat included) gets
        through on the slowest measured link: every batch in flight's activation, and the chain and
        global replicas of the largest stage (weights and momentum), queued ahead of it."""
        state = self.state
        if not state.links:
            return 0.0
        slowest = self._slowest_link().bandwidth
        # output_bytes were profiled on one training batch: the size of a real activation message.
        activations = state.bound() * max(state.profile.output_bytes)
        return 2 * activations / slowest + self._replica_slack()

    def _replica_slack(self) -> float:
        """Seconds the chain and global replicas of the largest stage (weights and momentum: 2 x 2 x its
        parameter bytes) occupy the slowest measured link, doubled for protocol overhead and jitter."""
        state = self.state
        if not state.links or not (state.chain_every or state.config.global_every):
            return 0.0
        slowest = self._slowest_link().bandwidth
        params = state.param_bytes
        stages = range(len(state.points) - 1)
        replicas = (
            2 * 2 * max((sum(params[state.points[k] : state.points[k + 1]]) for k in stages), default=0)
        )
        return 2 * replicas / slowest

    def eval_bound(self) -> int:
        """Evaluation chunks in flight: enough to keep every stage busy, few enough that a slow stage's
        inbox holds only a handful (the test set is streamed, not pushed in at once)."""
        return max(2, self.state.bound())
