"""Initialization (papers/000 Sec. III-B): assign every worker its stage, wait until all are built,
measure every link along the path data takes (through the broker)."""

from __future__ import annotations

import logging
import time

import torch

from edgeagent.errors import TrainingError
from edgeagent.modes.pipeline.central.context import Fault, RunState
from edgeagent.pipeline.build import layer_slice
from edgeagent.pipeline.groups import Groups
from edgeagent.planner.dp import Link
from edgeagent.protocol.commands import MeasureLink, PaceReplicas
from edgeagent.protocol.messages import Assign
from edgeagent.protocol.topics import Family
from edgeagent.replication.store import snapshots_kept
from edgeagent.roles.central.node import DeviceState

log = logging.getLogger("edgeagent.roles.central")


class Setup:
    """Assignments, the stage's subscriptions, readiness barriers and link measurements."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.subscribed: list[str] = []  # what subscribe_stage listens to, until unsubscribe_stage

    def worker_from(self, device: str) -> DeviceState:
        """A device that joins or comes back: what it announced (speed, memory limit) counts again."""
        announce = self.state.announced.get(device)
        interval = self.state.node.heartbeat_intervals.get(device, 0.0)
        if announce is None:
            return DeviceState(device, time.monotonic(), heartbeat_interval=interval)
        return DeviceState(
            device,
            time.monotonic(),
            slowdown=announce.slowdown,
            memory_limit=announce.memory_limit,
            heartbeat_interval=interval,
        )

    def assign(
        self,
        device: str,
        *,
        committed: int = -1,
        status: int = 0,
        weights: dict[str, torch.Tensor] | None = None,
        momentum: dict[str, torch.Tensor] | None = None,
        worker_list: list[str] | None = None,
        points: list[int] | None = None,
        groups: Groups | None = None,
    ) -> None:
        """Send ``device`` the Table I state and everything it needs to build its stage."""
        state = self.state
        worker_list = worker_list or state.worker_list
        points = points or state.points
        groups = state.groups if groups is None else groups
        hybrid = state.mode != "pipeline"
        index = groups.member(device)[0] if hybrid else worker_list.index(device)
        members, shares = groups.to_wire() if hybrid else ([], [])
        profile = state.profile
        state.send(
            state.topics.device(Family.CONTROL, device),
            Assign(
                run_id=state.run_id,
                plan_id=state.plan_id,
                worker_list=worker_list,
                points=points,
                model=state.spec.to_dict(),
                seed=state.train.seed,
                committed_forward_id=committed,
                committed_backward_id=committed,
                status=status,
                options=state.options,
                epochs=state.train.epochs,
                batches_per_epoch=state.per_epoch,
                in_flight=state.bound(),
                weights=layer_slice(weights, points[index], points[index + 1]),
                momentum_buffers=layer_slice(momentum, points[index], points[index + 1]),
                chain_every=state.chain_every,
                global_every=state.config.global_every,
                replicas=state.config.replicas,
                replica_share=state.replica_share(),
                recovery_logs=state.config.recovery_mode == "resume",
                metrics_interval=state.config.metrics_interval,
                layer_shapes=[list(shape) for shape in profile.output_shapes],
                layer_dtypes=list(profile.output_dtypes),
                mode=state.mode,
                groups=members,
                shares=shares,
                share_version=groups.version,
                heartbeat_interval=state.config.heartbeat_interval,
            ),
        )

    def build_workers(self) -> None:
        """Every device of every stage builds its stage (a replicated stage's helpers too: the pipeline's
        groups are one device each); the central node keeps a replica of stage 0 at the start."""
        state = self.state
        devices = state.groups.devices[1:]
        for device in devices:
            self.assign(
                device,
                weights=state.initial,
                momentum=state.initial_momentum,
                committed=state.start_version - 1,
            )
        # A replica at the starting version: no rollback ever goes past the weights the run started from
        # (the workers send theirs before "built"; see the worker's session).
        state.store.snapshot(state.stage)
        self.subscribe_stage()
        self.wait_ready(state.plan_id, "built", set(devices))

    def stage_topics(self) -> list[str]:
        state = self.state
        n = len(state.worker_list)
        if n < 2:
            return []
        # Every device's gradients of stage 1 and results of the last stage (the plan says whose count).
        topics = [
            state.topics.stage_filter(Family.GRADIENTS, 1),
            state.topics.stage_filter(Family.RESULTS, n - 1),
        ]
        if len(state.groups.members[0]) > 1:  # stage 0's helpers' gradient sums (hybrid)
            topics.append(state.topics.stage_filter(Family.SYNC, 0))
        # The last ``replicas`` workers' chain replicas wrap around to the central node; a worker whose
        # uplink is paced (replica_share) sends every replica, global ones included, on its replica topic.
        wrapped = state.worker_list[max(1, n - state.config.replicas) :]
        paced = [d for d in state.worker_list[1:] if d not in wrapped and state.paces(d)]
        for device in [*paced, *wrapped]:
            topics.append(state.topics.device(Family.REPLICA, device))
        return topics

    def subscribe_stage(self) -> None:
        state = self.state
        state.store.keep = snapshots_kept(state.replica_share())
        self.subscribed = self.stage_topics()
        for topic in self.subscribed:
            state.listen(topic)

    def unsubscribe_stage(self) -> None:
        for topic in self.subscribed:
            self.state.stop_listening(topic)
        self.subscribed = []

    def wait_ready(
        self, plan_id: int, phase: str, devices: set[str], *, timeout: float | None = None
    ) -> Fault | None:
        """Wait until ``devices`` report ``phase`` for ``plan_id``; a Fault if one of them stops meanwhile
        (once training has started) or, mid-run, ``timeout`` (derived from the bytes the phase moves:
        :meth:`_barrier`) runs out; a TrainingError if one of them fails, or at set-up (no ``timeout``)
        when the start-up time runs out."""
        state = self.state
        state.inbox.error = ""

        def pending() -> set[str]:
            return devices - {d for d, p in state.inbox.ready.get(plan_id, {}).items() if p == phase}

        def fault() -> Fault | None:
            if state.inbox.error:
                raise TrainingError(state.inbox.error)
            dead = sorted(d for d in pending() if d in state.workers and not state.workers[d].online)
            if dead and state.train_started:
                return Fault(dead, f"worker(s) {dead} stopped while the pipeline was switching")
            return None

        return state.node.wait_until(
            lambda: not pending(),
            state.config.startup_timeout if timeout is None else timeout,
            lambda: f"workers {sorted(pending())} did not report {phase!r} for plan {plan_id}",
            fault=fault,
            expired=None if timeout is None else lambda why: Fault([], why),
        )

    def measure_links(self) -> list[Link]:
        """Bandwidth and latency of every link k -> k+1 along the real path (through the broker)."""
        state = self.state
        n = len(state.worker_list)
        if n < 2:
            return []
        for k in range(1, n - 1):
            state.send(
                state.topics.fixed(Family.COMMAND),
                MeasureLink(
                    run_id=state.run_id,
                    source=state.worker_list[k],
                    target=state.worker_list[k + 1],
                ),
            )
        bandwidth, latency = state.node.probes.measure(state.worker_list[1])
        links = {state.device_id: Link(bandwidth, latency)}

        def measured(sources: list[str]) -> bool:
            for source, rep in list(state.inbox.links.items()):
                links[source] = Link(rep.bandwidth, rep.latency)
            return set(sources) <= set(links)

        def missing() -> str:
            return f"link measurements missing from {sorted(set(state.worker_list) - set(links))}"

        state.node.wait_until(lambda: measured(state.worker_list[:-1]), state.config.startup_timeout, missing)
        # Then the last device's uplink (to the central node): no link of the DP, but its gradients,
        # replicas, served layers and heartbeats cross it, and every wait for those follows it. Measured
        # after the others: its echoes of its predecessor's probes must not queue behind its own probes.
        last = state.worker_list[-1]
        state.node.probes.watch(last)  # echo its probes
        state.send(
            state.topics.fixed(Family.COMMAND),
            MeasureLink(run_id=state.run_id, source=last, target=state.device_id),
        )
        state.node.wait_until(lambda: measured(state.worker_list), state.config.startup_timeout, missing)
        state.uplinks = dict(links)
        result = [links[d] for d in state.worker_list[:-1]]
        for k, lk in enumerate([*result, links[last]]):
            log.info(
                "link %d->%d: %.1f MB/s, %.2f ms per message",
                k,
                (k + 1) % n,
                lk.bandwidth / 1e6,
                lk.latency * 1e3,
            )
        return result

    def pace_slow_uplinks(self) -> dict[str, float]:
        """After the links are measured: the replicas of every worker whose real uplink is slower than
        ``replica_pace_mbps`` go in its idle time, within ``replica_share`` of it, as over an emulated
        slow uplink (issue 52: a 0.5 Mbit/s uplink took 8 s per replica, stalling the pipeline). The
        central node listens to those workers' replica topics first (a paced replica is sent once, there),
        then tells every worker (:class:`PaceReplicas`). Returns the paced uplinks (Mbit/s)."""
        state = self.state
        config = state.config
        if config.replica_share <= 0 or config.replica_pace_mbps <= 0:
            return {}
        slow = {
            device: round(link.bandwidth * 8 / 1e6, 3)
            for device, link in state.uplinks.items()
            if device in state.worker_list[1:]
            and not state.paces(device)
            and link.bandwidth * 8 / 1e6 < config.replica_pace_mbps
        }
        if not slow:
            return {}
        state.paced_uplinks.update(slow)
        state.store.keep = snapshots_kept(state.replica_share())
        for topic in self.stage_topics():
            if topic not in self.subscribed:
                state.listen(topic)
                self.subscribed.append(topic)
        state.send(
            state.topics.fixed(Family.COMMAND),
            PaceReplicas(run_id=state.run_id, share=config.replica_share, uplinks=slow),
        )
        log.info(
            "replicas paced in the idle time of slow uplinks (below %.1f Mbit/s: %s), at most %.0f %% each",
            config.replica_pace_mbps,
            ", ".join(f"{d} {mbps:.2f} Mbit/s" for d, mbps in slow.items()),
            100 * config.replica_share,
        )
        state.event("replicas-paced", uplinks=slow, share=config.replica_share)
        return slow

    def announce_to_home_assistant(self) -> None:
        state = self.state
        from edgeagent.ops.homeassistant import discovery_configs

        for device in state.worker_list:
            for topic, payload in discovery_configs(
                state.topics,
                device,
                prefix=state.config.home_assistant_prefix,
                central=device == state.worker_list[0],
            ).items():
                state.node.transport.publish(topic, payload, retain=True)
        log.info("Home Assistant discovery published for %s", ", ".join(state.worker_list))
