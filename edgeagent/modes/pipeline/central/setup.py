"""Initialization (papers/000 Sec. III-B): assign every worker its stage, wait until all are built,
measure every link along the path data takes (through the broker)."""

from __future__ import annotations

import logging
import time

import torch

from edgeagent.errors import TrainingError
from edgeagent.modes.pipeline.central.context import Fault
from edgeagent.modes.pipeline.central.handlers import Handlers
from edgeagent.pipeline.build import layer_slice
from edgeagent.pipeline.groups import Groups
from edgeagent.planner.dp import Link
from edgeagent.protocol.commands import MeasureLink
from edgeagent.protocol.messages import Assign
from edgeagent.protocol.topics import Family
from edgeagent.roles.central.node import DeviceState

log = logging.getLogger("edgeagent.roles.central")


class Setup(Handlers):
    """Assignments, the stage's subscriptions, readiness barriers and link measurements."""

    def _worker_from(self, device: str) -> DeviceState:
        """A device that joins or comes back: what it announced (speed, memory limit) counts again."""
        announce = self.announced.get(device)
        interval = self.node.heartbeat_intervals.get(device, 0.0)
        if announce is None:
            return DeviceState(device, time.monotonic(), heartbeat_interval=interval)
        return DeviceState(
            device,
            time.monotonic(),
            slowdown=announce.slowdown,
            memory_limit=announce.memory_limit,
            heartbeat_interval=interval,
        )

    def _assign(
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
        worker_list = worker_list or self.worker_list
        points = points or self.points
        groups = self.groups if groups is None else groups
        hybrid = self.MODE != "pipeline"
        index = groups.member(device)[0] if hybrid else worker_list.index(device)
        members, shares = groups.to_wire() if hybrid else ([], [])
        profile = self.profile
        self.send(
            self.topics.device(Family.CONTROL, device),
            Assign(
                run_id=self.run_id,
                plan_id=self.plan_id,
                worker_list=worker_list,
                points=points,
                model=self.spec.to_dict(),
                seed=self.train.seed,
                committed_forward_id=committed,
                committed_backward_id=committed,
                status=status,
                options=self.options,
                epochs=self.train.epochs,
                batches_per_epoch=self.per_epoch,
                in_flight=self.bound(),
                weights=layer_slice(weights, points[index], points[index + 1]),
                momentum_buffers=layer_slice(momentum, points[index], points[index + 1]),
                chain_every=self.config.chain_every,
                global_every=self.config.global_every,
                replicas=self.config.replicas,
                metrics_interval=self.config.metrics_interval,
                layer_shapes=[list(shape) for shape in profile.output_shapes],
                layer_dtypes=list(profile.output_dtypes),
                mode=self.MODE,
                groups=members,
                shares=shares,
                share_version=groups.version,
                heartbeat_interval=self.config.heartbeat_interval,
            ),
        )

    def _build_workers(self) -> None:
        """Every worker builds its stage; the central node keeps a replica of stage 0 at the start."""
        for device in self.worker_list[1:]:
            self._assign(
                device, weights=self.initial, momentum=self.initial_momentum, committed=self.start_version - 1
            )
        # A replica at the starting version: no rollback ever goes past the weights the run started from
        # (the workers send theirs before "built"; see the worker's session).
        self.store.snapshot(self.stage)
        self._subscribe_stage()
        self._wait_ready(self.plan_id, "built", set(self.worker_list[1:]))

    def _stage_topics(self) -> list[str]:
        n = len(self.worker_list)
        if n < 2:
            return []
        # Every device's gradients of stage 1 and results of the last stage (the plan says whose count).
        topics = [
            self.topics.stage_filter(Family.GRADIENTS, 1),
            self.topics.stage_filter(Family.RESULTS, n - 1),
        ]
        # The last ``replicas`` workers' chain replicas wrap around to the central node.
        for device in self.worker_list[max(1, n - self.config.replicas) :]:
            topics.append(self.topics.device(Family.REPLICA, device))
        return topics

    def _subscribe_stage(self) -> None:
        for topic in self._stage_topics():
            self.listen(topic)

    def _unsubscribe_stage(self) -> None:
        for topic in self._stage_topics():
            self.stop_listening(topic)

    def _wait_ready(
        self, plan_id: int, phase: str, devices: set[str], *, timeout: float | None = None
    ) -> Fault | None:
        """Wait until ``devices`` report ``phase`` for ``plan_id``; a Fault if one of them stops meanwhile
        (once training has started) or, mid-run, ``timeout`` (derived from the bytes the phase moves:
        :meth:`_barrier`) runs out; a TrainingError if one of them fails, or at set-up (no ``timeout``)
        when the start-up time runs out."""
        self.inbox.error = ""

        def pending() -> set[str]:
            return devices - {d for d, p in self.inbox.ready.get(plan_id, {}).items() if p == phase}

        def fault() -> Fault | None:
            if self.inbox.error:
                raise TrainingError(self.inbox.error)
            dead = sorted(d for d in pending() if d in self.workers and not self.workers[d].online)
            if dead and self.train_started:
                return Fault(dead, f"worker(s) {dead} stopped while the pipeline was switching")
            return None

        return self.node.wait_until(
            lambda: not pending(),
            self.config.startup_timeout if timeout is None else timeout,
            lambda: f"workers {sorted(pending())} did not report {phase!r} for plan {plan_id}",
            fault=fault,
            expired=None if timeout is None else lambda why: Fault([], why),
        )

    def _measure_links(self) -> list[Link]:
        """Bandwidth and latency of every link k -> k+1 along the real path (through the broker)."""
        n = len(self.worker_list)
        if n < 2:
            return []
        for k in range(1, n - 1):
            self.send(
                self.topics.fixed(Family.COMMAND),
                MeasureLink(run_id=self.run_id, source=self.worker_list[k], target=self.worker_list[k + 1]),
            )
        bandwidth, latency = self.node.probes.measure(self.worker_list[1])
        links = {self.device_id: Link(bandwidth, latency)}

        def measured(sources: list[str]) -> bool:
            for source, rep in list(self.inbox.links.items()):
                links[source] = Link(rep.bandwidth, rep.latency)
            return set(sources) <= set(links)

        def missing() -> str:
            return f"link measurements missing from {sorted(set(self.worker_list) - set(links))}"

        self.node.wait_until(lambda: measured(self.worker_list[:-1]), self.config.startup_timeout, missing)
        # Then the last device's uplink (to the central node): no link of the DP, but its gradients,
        # replicas, served layers and heartbeats cross it, and every wait for those follows it. Measured
        # after the others: its echoes of its predecessor's probes must not queue behind its own probes.
        last = self.worker_list[-1]
        self.node.probes.watch(last)  # echo its probes
        self.send(
            self.topics.fixed(Family.COMMAND),
            MeasureLink(run_id=self.run_id, source=last, target=self.device_id),
        )
        self.node.wait_until(lambda: measured(self.worker_list), self.config.startup_timeout, missing)
        self.uplinks = dict(links)
        result = [links[d] for d in self.worker_list[:-1]]
        for k, lk in enumerate([*result, links[last]]):
            log.info(
                "link %d->%d: %.1f MB/s, %.2f ms per message",
                k,
                (k + 1) % n,
                lk.bandwidth / 1e6,
                lk.latency * 1e3,
            )
        return result

    def _announce_to_home_assistant(self) -> None:
        from edgeagent.ops.homeassistant import discovery_configs

        for device in self.worker_list:
            for topic, payload in discovery_configs(
                self.topics,
                device,
                prefix=self.config.home_assistant_prefix,
                central=device == self.worker_list[0],
            ).items():
                self.node.transport.publish(topic, payload, retain=True)
        log.info("Home Assistant discovery published for %s", ", ".join(self.worker_list))
