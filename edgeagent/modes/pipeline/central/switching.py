"""Switching to a new split (papers/000 Sec. III-D, Algorithm 1): devices fetch the layers they lack,
then a commit barrier; joiners are admitted the same way. Used by re-splits and by recoveries."""

from __future__ import annotations

import logging
import time

from edgeagent.modes.pipeline.central.context import Fault, Plan, RunState
from edgeagent.modes.pipeline.central.liveness import Liveness
from edgeagent.modes.pipeline.central.planning import Planning
from edgeagent.modes.pipeline.central.setup import Setup
from edgeagent.pipeline.groups import Groups
from edgeagent.pipeline.runner import StageRunner
from edgeagent.planner.redistribute import bytes_sent, redistribution_plan
from edgeagent.protocol.messages import Commit, Repartition
from edgeagent.protocol.topics import Family
from edgeagent.replication.switch import Switch

log = logging.getLogger("edgeagent.roles.central")


class Switching:
    """Moves the pipeline to a new split; every wait returns a :class:`Fault` if a device stops or its
    time (derived from the bytes it moves) runs out."""

    def __init__(self, state: RunState, setup: Setup, planning: Planning, liveness: Liveness) -> None:
        self.state = state
        self.setup = setup
        self.planning = planning
        self.liveness = liveness

    def _fetch_bytes(self, order: Repartition, groups: Groups) -> int:
        """The most bytes one device sends in the fetches of ``order`` (each sends on its own uplink)."""
        sources = order.sources or order.previous_workers
        try:
            plans = redistribution_plan(
                order.previous_points, order.points, sources, order.worker_list, alive=set(sources)
            )
        except ValueError:  # Switch.start reports it; the wait assumes the whole model moves
            return 2 * sum(self.state.param_bytes)
        helpers = {members[0]: len(members) - 1 for members in groups.members if len(members) > 1}
        return max(bytes_sent(plans, self.state.param_bytes, helpers=helpers).values(), default=0)

    def admit_joiners(self, plan: Plan, version: int) -> Fault | None:
        """Give joining devices the run's state for the new split; they fetch their layers in the switch."""
        state = self.state
        groups = plan.groups or Groups.single(plan.workers)
        joiners = [d for d in groups.devices if d not in state.groups.devices]
        for device in joiners:
            state.inbox.ready.get(state.plan_id, {}).pop(device, None)
            self.setup.assign(
                device, committed=version - 1, worker_list=plan.workers, points=plan.points, groups=groups
            )
            known = state.workers.get(device)
            state.workers[device] = self.setup.worker_from(device)
            if known is not None:  # a device of the run left out before: what its liveness says stands
                state.workers[device].online = known.online
                state.workers[device].last_heartbeat = known.last_heartbeat
        # A joiner replicates its (seeded) stage of the new split before it says "built".
        deadline = self.liveness.barrier(self.liveness.replica_bytes(plan.points))
        fault = self.setup.wait_ready(state.plan_id, "built", set(joiners), timeout=deadline)
        if fault is not None:
            self._drop_joiners(joiners, fault.reason)
            return fault
        for device in joiners:
            if device in state.joiners:
                state.joiners.remove(device)
            log.info("%s joined the run at batch %d", device, version)
            state.event("join", device=device, batch=version)
        return None

    def _drop_joiners(self, joiners: list[str], why: str) -> None:
        """Joiners that did not say "built" are out of the next plans (the recovery's among them) until
        they show signs of life again (a heartbeat, an announcement): planned again and again, a device
        that died after it announced itself would cost every re-split a whole barrier."""
        state = self.state
        built = state.inbox.ready.get(state.plan_id, {})
        missing = [d for d in joiners if built.get(d) != "built"]
        for device in missing:
            if device in state.joiners:
                state.joiners.remove(device)
            w = state.workers.get(device)
            if w is not None:
                w.online = False
        if missing:
            log.warning(
                "%s did not join (%s): left out until they beat or announce themselves again; check "
                "their logs (`journalctl -u edgeagent-worker` on each)",
                missing,
                why,
            )

    def switch_to(
        self,
        points: list[int],
        *,
        version: int,
        workers: list[str] | None = None,
        sources: list[str] | None = None,
        recovery: bool = False,
        reason: str = "",
        groups: Groups | None = None,
    ) -> Fault | None:
        """Move layers to a new split: fetch, commit, build (the pipeline is drained or stopped).

        For a recovery every stage rolls back to ``version`` and ``sources`` says who serves each old
        stage's weights; ``workers`` is the new worker list (survivors, in their old order). A device
        that stops meanwhile is returned as a :class:`Fault`.
        """
        state = self.state
        new_list = workers or state.worker_list
        # Hybrid stages: every stage's devices in the new plan (one per stage unless told otherwise).
        new_groups = groups if groups is not None else Groups.single(new_list)
        members, shares = new_groups.to_wire() if state.mode != "pipeline" else ([], [])
        everyone = [d for d in new_groups.devices if d != state.device_id]
        # Plan ids are never reused: a switch that a fault interrupted must not lend its replies to the next.
        state.plan_counter = max(state.plan_counter, state.plan_id) + 1
        # ResPipe's T in seconds: the new plan's period from the rate measured under the old one.
        state.new_plan_period(version)
        order = Repartition(
            run_id=state.run_id,
            plan_id=state.plan_counter,
            points=points,
            worker_list=new_list,
            previous_points=state.points,
            previous_workers=state.worker_list,
            version=version,
            reason=reason,
            recovery=recovery,
            sources=sources or [],
            groups=members,
            shares=shares,
            in_flight=state.train.in_flight or len(new_list),
            chain_every=state.chain_every,
        )
        # Devices of the old plan that the new one leaves out hear of it too: they serve their layers
        # until the commit (hybrid stages: a helper that is no longer needed).
        for device in dict.fromkeys([*everyone, *state.groups.devices]):
            if device != state.device_id:
                state.send(state.topics.device(Family.CONTROL, device), order)
        switch = Switch.start(
            state.device_id,
            order,
            state.store,
            state.stage,
            state.spec,
            state.train.seed,
        )
        assert switch is not None
        state.switch = switch
        for holder in switch.holders:
            state.listen(state.topics.device(Family.REPLICA, holder))
        for request in switch.requests():
            state.send(state.topics.device(Family.REQUEST, state.device_id), request)

        def holder_gone() -> Fault | None:
            gone = sorted(h for h in switch.holders if h in state.workers and not state.workers[h].online)
            return (
                Fault(gone, f"{gone} stopped while serving layers for plan {order.plan_id}") if gone else None
            )

        # Every wait of the switch follows the bytes it moves over the measured links (a MobileNetV2
        # stage on a 0.5 Mbit/s uplink takes minutes); running out of it is a fault like any other.
        moved, replicas = self._fetch_bytes(order, new_groups), self.liveness.replica_bytes(list(points))
        fetching, building = self.liveness.barrier(moved), self.liveness.barrier(replicas)
        log.info(
            "plan %d: up to %.0f s for the layers (%.1f MB from the busiest holder), then up to %.0f s for "
            "the devices to replicate their new stages and say built (%.1f MB for the largest)",
            order.plan_id,
            fetching,
            moved / 1e6,
            building,
            replicas / 1e6,
        )
        until = time.monotonic() + fetching
        fault = state.node.wait_until(
            lambda: switch.complete,
            until - time.monotonic(),
            lambda: f"layers {switch.pending} never arrived for plan {order.plan_id}",
            fault=holder_gone,
            expired=lambda why: Fault([], why),
        ) or self.setup.wait_ready(
            order.plan_id, "fetched", set(everyone), timeout=max(0.0, until - time.monotonic())
        )
        if fault is not None:
            return fault
        state.send(state.topics.fixed(Family.COMMIT), Commit(run_id=state.run_id, plan_id=order.plan_id))
        built = switch.build(state.spec, state.train.seed, state.options)
        state.runner = StageRunner(built, 0, codecs=state.codecs, log_keep=state.runner.log_keep)
        for holder in switch.plan.fetch:
            state.stop_listening(state.topics.device(Family.REPLICA, holder))
        state.switch = None
        self.setup.unsubscribe_stage()
        state.plan_id, state.points, state.worker_list = (
            order.plan_id,
            list(points),
            list(new_list),
        )
        state.groups = new_groups
        self.setup.subscribe_stage()
        # Snapshots of the old layout cannot restore the new one: start afresh at this version. The
        # workers' global replicas of it arrive before their "built" (same topic).
        state.store.clear()
        state.store.snapshot(state.stage)
        fault = self.setup.wait_ready(order.plan_id, "built", set(everyone), timeout=building)
        if fault is not None:
            return fault
        state.stage_times = []
        state.stage_history.clear()
        state.bits = None  # a new split: tell every stage its codecs again
        self.planning.apply_compression(epoch=version // max(1, state.per_epoch))
        self.liveness.refresh_deadline()
        state.event(
            "partition",
            points=points,
            batch=version,
            plan_id=state.plan_id,
            workers=new_list,
            **({"groups": members} if members else {}),
        )
        return None
