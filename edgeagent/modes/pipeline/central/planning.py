"""Planning (papers/000 Sec. III-D): the DP's problem from what was measured, the initial split, the
re-split job, the links of a new worker list, and the bit widths of the links (AccEPT)."""

from __future__ import annotations

import itertools
import logging
import math
from concurrent.futures import Future
from typing import Any

from edgeagent.compression.schedule import stage_bits
from edgeagent.compression.stage import NONE
from edgeagent.errors import PlanningError
from edgeagent.modes.pipeline.central.context import Plan
from edgeagent.modes.pipeline.central.estimation import Estimation
from edgeagent.planner.capacity import capacities
from edgeagent.planner.dp import Link, Problem, compute_time, solve
from edgeagent.planner.partition import balanced_partition
from edgeagent.planner.policy import choose_plan
from edgeagent.protocol.commands import Emulate, SetCompression
from edgeagent.protocol.topics import Family

log = logging.getLogger("edgeagent.roles.central")


class Planning(Estimation):
    """The split: from the DP over measured capacities (or predicted times) and links; bit widths per link."""

    def _problem(
        self, caps: list[float], workers: list[str] | None = None, links: list[Link] | None = None
    ) -> Problem:
        profile = self.profile
        params = self.param_bytes
        devices = workers or self.worker_list
        limits = self._memory_limits(devices)
        return Problem(
            memory_limits=limits,
            layer_times=tuple(profile.seconds),
            output_bytes=tuple(profile.output_bytes),
            capacities=tuple(caps),
            links=tuple(self.links if links is None else links),
            param_bytes=params,
            in_flight=self.train.in_flight or len(devices),
            activation_factor=self._comm_factor(len(devices)),
            range_times=self._range_times(devices),
            tie_break=self.tie_break,
            tie_tolerance=self.config.tie_tolerance,
        )

    def _comm_factor(self, n: int) -> float:
        """Compressed / raw bytes on the links (AccEPT eq. 9-10: the DP sees compressed sizes).

        Each link carries activations one way and gradients the other: the mean of the two ratios.
        """
        if self.bits is None or n < 2 or len(self.bits[0]) != n:
            return 1.0
        forward, backward = self.bits
        shares = [(min(forward[k], NONE) + min(backward[k + 1], NONE)) / (2 * NONE) for k in range(n - 1)]
        return sum(shares) / len(shares)

    def _memory_limits(self, devices: list[str]) -> tuple[float | None, ...] | None:
        """Per stage: the memory limit its device announced (bytes), None for none; None if nobody has one."""
        limits = [None, *(self._limit_of(d) or None for d in devices[1:])]
        return tuple(limits) if any(limits) else None

    def _limit_of(self, device: str) -> float:
        """A worker's memory limit in bytes (0: none); a joiner's from its announcement."""
        w = self.workers.get(device)
        if w is not None:
            return w.memory_limit
        announce = self.announced.get(device)
        return announce.memory_limit if announce is not None else 0.0

    def _solve(self, problem: Problem) -> list[int]:
        """The DP's split, or a :class:`PlanningError` that says what to change when none fits."""
        try:
            return solve(problem)
        except ValueError as exc:
            raise PlanningError(
                f"{exc}; give the devices more memory (--memory-limit-mb, device profiles), add devices, "
                "or lower --in-flight / the batch size"
            ) from None

    def initial_points(self) -> list[int]:
        """The initial split (and ``--partition uniform``'s only one): PipeDream's equal-device split
        (papers/000 Sec. III-B); with memory limits, the same objective (equal devices, links free)
        solved by the DP under those limits, so a memory-tight device never gets more than it holds."""
        n = len(self.worker_list)
        if self.device_times is not None and n > 1:
            # AccEPT: every device's predicted times from its h (links not measured yet: free).
            return self._solve(self._problem(self._first_capacities(), links=[Link(math.inf)] * (n - 1)))
        if self._memory_limits(self.worker_list) is None:
            return balanced_partition(self.profile.seconds, n)
        equal = self._problem([1.0] * n, links=[Link(math.inf)] * (n - 1))
        return self._solve(equal)

    def _initial_reason(self) -> str:
        if self.device_times is not None and len(self.worker_list) > 1:
            return "initial: predicted times from every device's h (AccEPT)"
        return "initial: equal devices (PipeDream)"

    def _first_capacities(self) -> list[float]:
        """Before anything ran: the central node's own emulated slowdown (its profile is eq. 9's ``T^0``),
        equal devices for workers (ignored where the predictor has a device's h)."""
        return [self.config.slowdown, *[1.0] * (len(self.worker_list) - 1)]

    def _true_capacities(self) -> list[float]:
        return [self.config.slowdown, *(self.workers[d].slowdown for d in self.worker_list[1:])]

    def _measured_capacities(self) -> list[float] | None:
        profile = self.profile
        own = self.runner.recent
        if len(self.stage_times) != len(self.worker_list) - 1 or not own:
            return None
        times = [sum(own) / len(own), *self.stage_times]
        return capacities(times, profile.seconds, self.points)

    def _plan(self, caps: list[float], current: list[int], workers: list[str]) -> Plan:
        """The planning job (runs on the scheduler's thread): planner.policy.choose_plan."""
        problem = self._problem(caps, workers=workers, links=self._links_for(workers))
        try:
            choice = choose_plan(
                problem,
                current,
                joiners=workers[len(self.worker_list) :],
                horizon_batches=self.policy.every,
                move_bandwidth=min((lk.bandwidth for lk in self.links), default=1e9),
            )
        except ValueError as exc:
            raise PlanningError(f"{exc}; the split stays as it is") from None
        return Plan(choice.points, choice.predicted, choice.reason, workers)

    def _start_planning(self, done: int) -> None:
        caps = self._measured_capacities()
        if caps is None or self.plan_job is not None:
            return
        if not self.h_changed:  # a re-plan for a new h: the stage times at hand were measured before it
            self._observe_stage_times(self.total - done)
        joiners = [d for d in self.joiners if d not in self.worker_list]
        workers = [*self.worker_list, *joiners]
        # A newcomer's speed is unknown until it has run: take the mean of the workers' capacities.
        known = caps[1:] or caps
        caps = [*caps, *[sum(known) / len(known)] * len(joiners)]
        gap = self.device_times is not None and bool(self.device_times.gaps)
        replan = self._replan_due(joiners)
        self._schedule_recheck(done, gap)
        if self.device_times is not None:
            caps[0] = self.config.slowdown  # eq. 9: the central node's own profile is T^0
        job: Future[Plan] = Future()
        current = list(self.points)

        def run() -> None:
            try:
                if replan:  # the adaptive update where its predictor is used: a plan (see _adapt_predictor)
                    self._adapt_predictor()
                    job.set_result(self._plan(caps, current, workers))
                else:
                    reason = "kept: no device's h changed (AccEPT re-plans when a device's h does)"
                    job.set_result(Plan(current, 0.0, reason, list(self.worker_list)))
            except Exception as exc:  # a planning bug must not stop training: keep the split
                job.set_exception(exc)

        if self.node.background(run, f"plan-{self.plan_id}"):
            self.plan_job = job

    def _compression_bits(self, epoch: int) -> tuple[list[int], list[int]]:
        """Bit widths per stage (compression.stage_bits) from the mode, the epoch and the links."""
        n = len(self.worker_list)
        links: list[tuple[float, int]] = []
        step = 0.0
        if self.config.compression == "auto" and n > 1:
            problem = self._problem(self._measured_capacities() or [1.0] * n)
            # The compute a transfer can hide behind: the slowest stage's (not the predicted step, which
            # already contains the slow link itself).
            step = max(compute_time(problem, k, self.points[k], self.points[k + 1]) for k in range(n))
            sizes = [self.profile.output_bytes[self.points[k + 1] - 1] for k in range(n - 1)]
            links = [(lk.bandwidth, size) for lk, size in zip(self.links, sizes, strict=False)]
        mode, epochs = self.config.compression, self.train.epochs
        return stage_bits(mode, n, epoch=epoch, epochs=epochs, links=links, compute_seconds=step)

    def _apply_compression(self, epoch: int) -> None:
        """Tell every stage its codecs when they change (start, epoch, new split, new links)."""
        bits = self._compression_bits(epoch)
        if bits == self.bits:
            return
        self.bits = bits
        forward, backward = bits
        self.codecs.set_bits(forward[0], backward[0])
        if len(self.worker_list) > 1:
            self.send(
                self.topics.fixed(Family.COMMAND),
                SetCompression(run_id=self.run_id, plan_id=self.plan_id, forward=forward, backward=backward),
            )
        log.info(
            "compression %s: forward bits %s, backward bits %s", self.config.compression, forward, backward
        )
        self.event("compression", forward=forward, backward=backward, epoch=epoch)

    def _emulate(self, device: str, factor: float, batch: int) -> None:
        log.info("batch %d: %s now emulates a %.1fx slower device", batch, device, factor)
        if device == self.device_id:
            self.config = self.config.model_copy(update={"slowdown": factor})
        else:
            self.send(
                self.topics.fixed(Family.COMMAND),
                Emulate(run_id=self.run_id, device=device, slowdown=factor),
            )
        self.event("slowdown", device=device, slowdown=factor, batch=batch)

    def _links_for(self, new_list: list[str]) -> list[Link]:
        """Links of a new worker list: measured ones where neighbours stay neighbours; for new pairs the
        slowest measured link (no probe, to keep a recovery short)."""
        old_links = dict(zip(itertools.pairwise(self.worker_list), self.links, strict=False))
        slowest = min(self.links, key=lambda lk: lk.bandwidth) if self.links else Link(1e9)
        return [old_links.get(pair, slowest) for pair in itertools.pairwise(new_list)]

    def _survivor_split(self, new_list: list[str]) -> list[int]:
        """The DP over the survivors (measured capacities where known, else equal devices)."""
        caps = self._measured_capacities()
        by_device = dict(zip(self.worker_list, caps, strict=True)) if caps else {}
        survivor_caps = [by_device.get(d, 1.0) for d in new_list]
        problem = self._problem(survivor_caps, workers=new_list, links=self._links_for(new_list))
        return self._solve(problem)

    def _record_partition(self, batch: int, reason: str, predicted: float | None = None) -> None:
        entry: dict[str, Any] = {
            "batch": batch,
            "points": list(self.points),
            "plan_id": self.plan_id,
            "reason": reason,
        }
        if predicted is not None:
            entry["predicted_step"] = predicted
        self.report.partitions.append(entry)
        log.info("partition %s from batch %d (%s)", self.points, batch, reason)
