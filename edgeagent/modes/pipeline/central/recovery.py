"""Fault tolerance (papers/000 Sec. III-F): probe the devices, pick the recovery case and the version to
roll back to (planner/recovery.py), re-split over the survivors, roll every stage back, replay."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgeagent.errors import TrainingError
from edgeagent.modes.pipeline.central.context import Fault
from edgeagent.modes.pipeline.central.evaluation import Evaluation
from edgeagent.planner.recovery import (
    RecoveryPoint,
    choose_recovery_point,
    classify_probe,
    new_worker_list,
    respipe_points,
)
from edgeagent.protocol.commands import Ping
from edgeagent.protocol.messages import Discover
from edgeagent.protocol.topics import Family

log = logging.getLogger("edgeagent.roles.central")

MAX_FAULTS_IN_A_ROW = 5


@dataclass(frozen=True)
class Outcome:
    """What the probe found and what the recovery does about it."""

    case: int
    restarted: set[str]
    missing: set[str]
    point: RecoveryPoint
    holdings: dict[str, dict[str, list[int]]]
    workers: list[str]  # the new worker list
    points: list[int]  # the new split


class Recovery(Evaluation):
    """Recovers from a :class:`Fault`; a device that stops during the recovery starts another one."""

    def _recover_until_done(self, fault: Fault, committed_b: int) -> int:
        """Recover (at most ``MAX_FAULTS_IN_A_ROW`` faults in a row); return the new committed id."""
        for _ in range(MAX_FAULTS_IN_A_ROW):
            result = self._recover(fault, committed_b)
            if not isinstance(result, Fault):
                return result
            log.warning("another fault during the recovery: %s", result.reason)
            fault = result
        raise TrainingError(f"gave up after {MAX_FAULTS_IN_A_ROW} faults in a row; the last: {fault.reason}")

    def _recover(self, fault: Fault, committed_b: int) -> int | Fault:
        """Probe, pick survivors and a recovery point, re-split, roll back; return the new committed id."""
        detected = self.clock()
        self.status = 1  # set once: later timers of the same fault do not start another recovery
        fault_batch = committed_b + 1
        log.warning("fault at batch %d: %s; probing the workers", fault_batch, fault.reason)
        self.event("fault", batch=fault_batch, reason=fault.reason, devices=fault.dead)
        outcome = self._plan_recovery(*self._probe_devices())
        point = outcome.point
        for device in outcome.restarted:
            # Case 2: it came back with its id. Send it the Table I state (status 1); it builds a fresh
            # stage, then fetches its replica in the switch below.
            self.inbox.ready.get(self.plan_id, {}).pop(device, None)
            self._assign(device, committed=point.version - 1, status=1)
            self.workers[device] = self._worker_from(device)
        reason = (
            f"recovery case {outcome.case}: lost {sorted(outcome.missing)}, restarted "
            f"{sorted(outcome.restarted)}; rolled back to version {point.version}"
        )
        new_links = self._links_for(outcome.workers)
        # A restarted device builds an empty stage (status 1: no replicas before "built").
        built = self._barrier(0)
        again = self._wait_ready(self.plan_id, "built", outcome.restarted, timeout=built) or self._switch_to(
            outcome.points,
            version=point.version,
            workers=outcome.workers,
            sources=list(point.sources),
            recovery=True,
            reason=reason,
        )
        if again is not None:
            return again
        self.links = new_links
        for device in outcome.missing:
            self.workers.pop(device, None)
        self.inbox.gradients.clear()
        self.sent_at.clear()
        self.runner.outputs.clear()
        self.inbox.results.clear()
        self._refresh_deadline()
        self.status = 0
        self._record_recovery(fault, outcome, fault_batch, detected, reason)
        return point.version - 1

    def _probe_devices(self) -> tuple[set[str], list[str]]:
        """Ping the run's devices and ask every idle one to announce itself; return (alive, idle).

        In-run devices answer the ping within the probe window (their slowest step and a round trip); one
        that restarted with its id (case 2) announces itself idle, which on a Pi takes a systemd restart
        and Python's start-up: a device that is really gone costs the whole restart window
        (``--restart-window``; 0 recovers at once without it). A device known to be down (last will,
        missed heartbeats) cannot answer before it restarts: it gets the restart window; the others the
        probe window.
        """
        self.inbox.alive.clear()
        self.announced.clear()

        def ask() -> None:
            self.send(self.topics.fixed(Family.COMMAND), Ping(run_id=self.run_id))
            self.send(self.topics.fixed(Family.DISCOVER), Discover(run_id=self.run_id))

        ask()
        expected = set(self.worker_list[1:])
        down = {d for d in expected if (w := self.workers.get(d)) is not None and not w.online}
        started = time.monotonic()
        probe = self._probe_window()
        until = {d: started + (self.config.restart_window if d in down else probe) for d in expected}
        longest = max(until.values(), default=started) - started
        log.info("waiting up to %.1f s for %s to answer or come back", longest, sorted(expected))

        def settled() -> bool:
            pending = expected - set(self.inbox.alive) - set(self.announced)
            for d in pending:  # a device whose last will came during the wait is down too: its window
                if (w := self.workers.get(d)) is not None and not w.online:
                    until[d] = max(until[d], started + self.config.restart_window)
            now = time.monotonic()
            return not any(now < until[d] for d in pending)

        # Asked again every probe window while the wait lasts: a device that was off the broker when the
        # ping went out (after a broker restart every client reconnects, each after its own backoff, and
        # a clean session keeps nothing for it) would never see it, and a live device of the run was
        # taken for gone at the end of its restart window (bench/chaos.py, a broker restart: every worker
        # dropped, the central node alone). Answers are idempotent. ``settled`` holds once every window
        # is over: the timeout is never what ends this wait.
        def asked_or_settled(again: float) -> Callable[[], bool]:
            return lambda: settled() or time.monotonic() >= again

        while True:
            self.node.wait_until(
                asked_or_settled(time.monotonic() + probe), probe + 60.0, "the recovery's probe", poll=0.05
            )
            if settled():
                break
            ask()
        idle = [d for d, a in self.announced.items() if not a.busy_with]
        return set(self.inbox.alive), idle

    def _plan_recovery(self, alive: set[str], idle: list[str]) -> Outcome:
        """The case (planner.recovery.classify_probe), the version to roll back to, the new split."""
        outcome = classify_probe(self.worker_list[1:], alive, idle)
        case, restarted, missing = outcome.case, set(outcome.restarted), set(outcome.missing)
        holdings: dict[str, dict[str, list[int]]] = {d: r.holdings for d, r in self.inbox.alive.items()}
        holdings[self.device_id] = self.store.holdings()
        # Version 0 rebuilt from the seed is the run's start only for a fresh run without pre-trained
        # weights; otherwise the start is a replica like any other (taken when the run started).
        seeded = self.start_version == 0 and not self.train.init_weights
        point = choose_recovery_point(
            self.worker_list,
            alive | {self.device_id},
            holdings,
            replicas=self.config.replicas,
            seeded=seeded,
            start=self.start_version,
        )
        new_list = new_worker_list(self.worker_list, alive | restarted | {self.device_id})
        points = list(self.points)
        if case == 3 and self.config.recovery == "respipe":
            points, new_list = respipe_points(self.points, self.worker_list, missing)
        elif case == 3:
            points = self._survivor_split(new_list)
        return Outcome(case, restarted, missing, point, holdings, new_list, points)

    def _record_recovery(
        self, fault: Fault, outcome: Outcome, fault_batch: int, detected: float, reason: str
    ) -> None:
        resumed = self.clock()
        point = outcome.point
        record: dict[str, Any] = {
            "case": outcome.case,
            "devices": sorted(outcome.missing | outcome.restarted | set(fault.dead)),
            "lost": sorted(outcome.missing),
            "restarted": sorted(outcome.restarted),
            "batch": fault_batch,
            "last_progress_at": round(self.last_progress, 4),
            "detected_at": round(detected, 4),
            "resumed_at": round(resumed, 4),
            "rolled_back_to": point.version,
            "batches_replayed": fault_batch - point.version,
            # Which weight versions each live device could serve (its own and the replicas it held).
            "holdings": outcome.holdings,
            "points": outcome.points,
            "workers": outcome.workers[1:],
            "recovery": self.config.recovery,
        }
        self.report.recoveries.append(record)
        self.report.partitions.append(
            {"batch": point.version, "points": outcome.points, "plan_id": self.plan_id, "reason": reason}
        )
        log.warning(
            "recovered (case %d) in %.2f s after detection: stages %s on %s, replaying from batch %d",
            outcome.case,
            resumed - detected,
            outcome.points,
            outcome.workers,
            point.version,
        )
        self.event("recovery", **record)
