"""Fault tolerance (papers/000 Sec. III-F): probe the devices, pick the recovery case and the newest version
every stage can be restored to (planner/recovery.py), then either bring the dead stage forward to where
the others are (``--recovery-mode resume``, central/catchup.py) or roll every stage back and replay; then
re-split over the survivors."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgeagent.errors import TrainingError
from edgeagent.modes.pipeline.central.catchup import Finish, ask_early, bring_forward, eligible, release
from edgeagent.modes.pipeline.central.context import Fault, RunState
from edgeagent.modes.pipeline.central.liveness import Liveness
from edgeagent.modes.pipeline.central.planning import Planning
from edgeagent.modes.pipeline.central.setup import Setup
from edgeagent.modes.pipeline.central.switching import Switching
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


class Recovery:
    """Recovers from a :class:`Fault`; a device that stops during the recovery starts another one."""

    def __init__(
        self, state: RunState, setup: Setup, planning: Planning, liveness: Liveness, switching: Switching
    ) -> None:
        self.state = state
        self.setup = setup
        self.planning = planning
        self.liveness = liveness
        self.switching = switching
        self.committed = -1  # the training loop's committed id during a recovery

    def recover_until_done(self, fault: Fault, committed_b: int, finish: Finish | None = None) -> int:
        """Recover (at most ``MAX_FAULTS_IN_A_ROW`` faults in a row); return the new committed id.
        ``finish``: the training loop's backward of its oldest batch in flight, for the batches a dead
        stage brought forward owed their gradients (without it every recovery rolls back)."""
        for _ in range(MAX_FAULTS_IN_A_ROW):
            self.committed = committed_b
            result = self._recover(fault, committed_b, finish)
            committed_b = self.committed  # a catch-up commits batches; they stay if its switch then fails
            if not isinstance(result, Fault):
                return result
            log.warning("another fault during the recovery: %s", result.reason)
            fault = result
        raise TrainingError(f"gave up after {MAX_FAULTS_IN_A_ROW} faults in a row; the last: {fault.reason}")

    def _recover(self, fault: Fault, committed_b: int, finish: Finish | None) -> int | Fault:
        """Probe, pick survivors and a recovery point, bring the dead stage forward or roll back, re-split;
        return the new committed id."""
        state = self.state
        detected, last_progress = state.clock(), state.last_progress
        state.status = 1  # set once: later timers of the same fault do not start another recovery
        fault_batch = committed_b + 1
        log.warning("fault at batch %d: %s; probing the workers", fault_batch, fault.reason)
        state.event("fault", batch=fault_batch, reason=fault.reason, devices=fault.dead)
        asked = ask_early(self.state, list(fault.dead)) if finish is not None else None
        try:
            outcome = self._plan_recovery(*self._probe_devices())
        except BaseException:
            release(state, asked)
            raise
        point = outcome.point
        version, sources = point.version, list(point.sources)
        why = eligible(state, outcome.missing, point) if outcome.case == 3 else f"case {outcome.case}"
        if why is not None or finish is None:
            release(state, asked)
        if why is None and finish is not None:
            (dead,) = outcome.missing
            wait = max(2.0, 2 * self.liveness.probe_window())
            caught_up = bring_forward(state, asked, dead, point, finish, committed_b, wait)
            if caught_up is not None:
                # Every stage is at ``caught_up``: each serves its own layers live, the central node the dead
                # stage's brought forward.
                version, self.committed = caught_up, caught_up - 1
                at = state.worker_list.index(dead)
                sources = [state.device_id if i == at else d for i, d in enumerate(state.worker_list)]
            else:
                why = "a piece of the catch-up did not come"
        elif why is None:
            why = "no training loop to finish the batches"
        for device in outcome.restarted:
            # Case 2: it came back with its id. Send it the Table I state (status 1); it builds a fresh
            # stage, then fetches its replica in the switch below.
            state.inbox.ready.get(state.plan_id, {}).pop(device, None)
            self.setup.assign(device, committed=point.version - 1, status=1)
            state.workers[device] = self.setup.worker_from(device)
        how = (
            f"rolled back to version {point.version}"
            if why is not None
            else f"brought {sorted(outcome.missing)} from version {point.version} to {version}, no rollback"
        )
        reason = (
            f"recovery case {outcome.case}: lost {sorted(outcome.missing)}, restarted "
            f"{sorted(outcome.restarted)}; {how}"
        )
        new_links = self.planning.links_for(outcome.workers)
        # A restarted device builds an empty stage (status 1: no replicas before "built").
        built = self.liveness.barrier(0)
        again = self.setup.wait_ready(
            state.plan_id, "built", outcome.restarted, timeout=built
        ) or self.switching.switch_to(
            outcome.points,
            version=version,
            workers=outcome.workers,
            sources=sources,
            recovery=True,
            reason=reason,
        )
        if again is not None:
            return again
        state.links = new_links
        for device in outcome.missing:
            state.workers.pop(device, None)
        state.inbox.gradients.clear()
        state.sent_at.clear()
        state.runner.outputs.clear()
        state.inbox.results.clear()
        self.liveness.refresh_deadline()
        state.status = 0
        self._record_recovery(fault, outcome, fault_batch, (last_progress, detected), reason, (version, why))
        return version - 1

    def _probe_devices(self) -> tuple[set[str], list[str]]:
        """Ping the run's devices and ask every idle one to announce itself; return (alive, idle).

        In-run devices answer the ping within the probe window (their slowest step and a round trip); one
        that restarted with its id (case 2) announces itself idle, which on a Pi takes a systemd restart
        and Python's start-up: a device that is really gone costs the whole restart window
        (``--restart-window``; 0 recovers at once without it). A device known to be down (last will,
        missed heartbeats) cannot answer before it restarts: it gets the restart window; the others the
        probe window.
        """
        state = self.state
        state.inbox.alive.clear()
        state.announced.clear()

        def ask() -> None:
            state.send(state.topics.fixed(Family.COMMAND), Ping(run_id=state.run_id))
            state.send(state.topics.fixed(Family.DISCOVER), Discover(run_id=state.run_id))

        ask()
        expected = set(state.worker_list[1:])
        down = {d for d in expected if (w := state.workers.get(d)) is not None and not w.online}
        started = time.monotonic()
        probe = self.liveness.probe_window()
        until = {d: started + (state.config.restart_window if d in down else probe) for d in expected}
        longest = max(until.values(), default=started) - started
        log.info("waiting up to %.1f s for %s to answer or come back", longest, sorted(expected))

        def settled() -> bool:
            pending = expected - set(state.inbox.alive) - set(state.announced)
            for d in pending:  # a device whose last will came during the wait is down too: its window
                if (w := state.workers.get(d)) is not None and not w.online:
                    until[d] = max(until[d], started + state.config.restart_window)
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
            state.node.wait_until(
                asked_or_settled(time.monotonic() + probe), probe + 60.0, "the recovery's probe", poll=0.05
            )
            if settled():
                break
            ask()
        idle = [d for d, a in state.announced.items() if not a.busy_with]
        return set(state.inbox.alive), idle

    def _plan_recovery(self, alive: set[str], idle: list[str]) -> Outcome:
        """The case (planner.recovery.classify_probe), the version to roll back to, the new split."""
        state = self.state
        outcome = classify_probe(state.worker_list[1:], alive, idle)
        case, restarted, missing = outcome.case, set(outcome.restarted), set(outcome.missing)
        holdings: dict[str, dict[str, list[int]]] = {d: r.holdings for d, r in state.inbox.alive.items()}
        holdings[state.device_id] = state.store.holdings()
        # Version 0 rebuilt from the seed is the run's start only for a fresh run without pre-trained
        # weights; otherwise the start is a replica like any other (taken when the run started).
        seeded = state.start_version == 0 and not state.train.init_weights
        point = choose_recovery_point(
            state.worker_list,
            alive | {state.device_id},
            holdings,
            replicas=state.config.replicas,
            seeded=seeded,
            start=state.start_version,
        )
        new_list = new_worker_list(state.worker_list, alive | restarted | {state.device_id})
        points = list(state.points)
        if case == 3 and state.config.recovery == "respipe":
            points, new_list = respipe_points(state.points, state.worker_list, missing)
        elif case == 3:
            points = self.planning.survivor_split(new_list)
        return Outcome(case, restarted, missing, point, holdings, new_list, points)

    def _record_recovery(
        self,
        fault: Fault,
        outcome: Outcome,
        fault_batch: int,
        times: tuple[float, float],
        reason: str,
        resumed_from: tuple[int, str | None],
    ) -> None:
        """``times``: the last progress before the fault and its detection; ``resumed_from``: the version
        training resumes at and why it is a rollback (None: the dead stage was brought forward)."""
        state = self.state
        resumed = state.clock()
        last_progress, detected = times
        version, rollback = resumed_from
        point = outcome.point
        record: dict[str, Any] = {
            "case": outcome.case,
            "devices": sorted(outcome.missing | outcome.restarted | set(fault.dead)),
            "lost": sorted(outcome.missing),
            "restarted": sorted(outcome.restarted),
            "batch": fault_batch,
            "last_progress_at": round(last_progress, 4),
            "detected_at": round(detected, 4),
            "resumed_at": round(resumed, 4),
            # The version the lost layers restart from (every stage's in a rollback, the dead one's else).
            "rolled_back_to": point.version,
            # Batches whose updates were applied and are computed again: by every stage in a rollback; without
            # one by the dead stage alone (the updates it lost), on its layers alone.
            "batches_replayed": fault_batch - point.version,
            # Where training resumes: the recovery point in a rollback; without one, past the batches that
            # were in flight at the fault and that the catch-up finished too (``resumed_from - batch``).
            "resumed_from": version,
            "recovery_mode": "rollback" if rollback is not None else "resume",
            "rollback_reason": rollback or "",
            # Which weight versions each live device could serve (its own and the replicas it held).
            "holdings": outcome.holdings,
            "points": outcome.points,
            "workers": outcome.workers[1:],
            "recovery": state.config.recovery,
        }
        state.report.recoveries.append(record)
        # As every partition is recorded (a hybrid run's with its stages' devices and shares).
        self.planning.record_partition(version, reason)
        log.warning(
            "recovered (case %d) in %.2f s after detection: stages %s on %s, training from batch %d",
            outcome.case,
            resumed - detected,
            outcome.points,
            outcome.workers,
            version,
        )
        state.event("recovery", **record)
