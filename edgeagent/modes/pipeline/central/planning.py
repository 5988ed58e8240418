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
from edgeagent.modes.pipeline.central.context import Plan, RunState
from edgeagent.modes.pipeline.central.estimation import Estimation
from edgeagent.planner.capacity import capacities
from edgeagent.planner.dp import Link, Problem, compute_time, solve
from edgeagent.planner.partition import balanced_partition
from edgeagent.planner.policy import choose_plan
from edgeagent.protocol.commands import Emulate, SetCompression
from edgeagent.protocol.topics import Family

log = logging.getLogger("edgeagent.roles.central")


class Planning:
    """The split: from the DP over measured capacities (or predicted times) and links; bit widths per link."""

    def __init__(self, state: RunState, estimation: Estimation) -> None:
        self.state = state
        self.estimation = estimation

    def problem(
        self, caps: list[float], workers: list[str] | None = None, links: list[Link] | None = None
    ) -> Problem:
        state = self.state
        profile = state.profile
        params = state.param_bytes
        devices = workers or state.worker_list
        limits = self._memory_limits(devices)
        return Problem(
            memory_limits=limits,
            layer_times=tuple(profile.seconds),
            output_bytes=tuple(profile.output_bytes),
            capacities=tuple(caps),
            links=tuple(state.links if links is None else links),
            param_bytes=params,
            in_flight=state.train.in_flight or len(devices),
            activation_factor=self._comm_factor(len(devices)),
            range_times=self.estimation.range_times(devices),
            tie_break=state.tie_break,
            tie_tolerance=state.config.tie_tolerance,
        )

    def _comm_factor(self, n: int) -> float:
        """Compressed / raw bytes on the links (AccEPT eq. 9-10: the DP sees compressed sizes).

        Each link carries activations one way and gradients the other: the mean of the two ratios.
        """
        state = self.state
        if state.bits is None or n < 2 or len(state.bits[0]) != n:
            return 1.0
        forward, backward = state.bits
        shares = [(min(forward[k], NONE) + min(backward[k + 1], NONE)) / (2 * NONE) for k in range(n - 1)]
        return sum(shares) / len(shares)

    def _memory_limits(self, devices: list[str]) -> tuple[float | None, ...] | None:
        """Per stage: the memory limit its device announced (bytes), None for none; None if nobody has one."""
        limits = [None, *(self._limit_of(d) or None for d in devices[1:])]
        return tuple(limits) if any(limits) else None

    def _limit_of(self, device: str) -> float:
        """A worker's memory limit in bytes (0: none); a joiner's from its announcement."""
        w = self.state.workers.get(device)
        if w is not None:
            return w.memory_limit
        announce = self.state.announced.get(device)
        return announce.memory_limit if announce is not None else 0.0

    def solve(self, problem: Problem) -> list[int]:
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
        state = self.state
        n = len(state.worker_list)
        if state.device_times is not None and n > 1:
            # AccEPT: every device's predicted times from its h (links not measured yet: free).
            return self.solve(self.problem(self.first_capacities(), links=[Link(math.inf)] * (n - 1)))
        if self._memory_limits(state.worker_list) is None:
            return balanced_partition(state.profile.seconds, n)
        equal = self.problem([1.0] * n, links=[Link(math.inf)] * (n - 1))
        return self.solve(equal)

    def initial_reason(self) -> str:
        if self.state.device_times is not None and len(self.state.worker_list) > 1:
            return "initial: predicted times from every device's h (AccEPT)"
        return "initial: equal devices (PipeDream)"

    def first_capacities(self) -> list[float]:
        """Before anything ran: the central node's own emulated slowdown (its profile is eq. 9's ``T^0``),
        equal devices for workers (ignored where the predictor has a device's h)."""
        return [self.state.config.slowdown, *[1.0] * (len(self.state.worker_list) - 1)]

    def true_capacities(self) -> list[float]:
        state = self.state
        return [
            state.config.slowdown,
            *(state.workers[d].slowdown for d in state.worker_list[1:]),
        ]

    def measured_capacities(self) -> list[float] | None:
        state = self.state
        profile = state.profile
        own = state.runner.recent
        if len(state.stage_times) != len(state.worker_list) - 1 or not own:
            return None
        times = [sum(own) / len(own), *state.stage_times]
        return capacities(times, profile.seconds, state.points)

    def _plan(self, caps: list[float], current: list[int], workers: list[str]) -> Plan:
        """The planning job (runs on the scheduler's thread): planner.policy.choose_plan."""
        state = self.state
        problem = self.problem(caps, workers=workers, links=self.links_for(workers))
        try:
            choice = choose_plan(
                problem,
                current,
                joiners=workers[len(state.worker_list) :],
                horizon_batches=state.policy.every,
                move_bandwidth=min((lk.bandwidth for lk in state.links), default=1e9),
            )
        except ValueError as exc:
            raise PlanningError(f"{exc}; the split stays as it is") from None
        return Plan(choice.points, choice.predicted, choice.reason, workers)

    def start_planning(self, done: int) -> None:
        state = self.state
        caps = self.measured_capacities()
        if caps is None or state.plan_job is not None:
            return
        if not state.h_changed:  # a re-plan for a new h: the stage times at hand were measured before it
            self.estimation.observe_stage_times(state.total - done)
        joiners = [d for d in state.joiners if d not in state.worker_list]
        workers = [*state.worker_list, *joiners]
        # A newcomer's speed is unknown until it has run: take the mean of the workers' capacities.
        known = caps[1:] or caps
        caps = [*caps, *[sum(known) / len(known)] * len(joiners)]
        gap = state.device_times is not None and bool(state.device_times.gaps)
        replan = self.estimation.replan_due(joiners)
        self.estimation.schedule_recheck(done, gap)
        if state.device_times is not None:
            caps[0] = state.config.slowdown  # eq. 9: the central node's own profile is T^0
        job: Future[Plan] = Future()
        current = list(state.points)

        def run() -> None:
            try:
                if replan:  # the adaptive update where its predictor is used: a plan (see _adapt_predictor)
                    self.estimation.adapt_predictor()
                    job.set_result(self._plan(caps, current, workers))
                else:
                    reason = "kept: no device's h changed (AccEPT re-plans when a device's h does)"
                    job.set_result(Plan(current, 0.0, reason, list(state.worker_list)))
            except Exception as exc:  # a planning bug must not stop training: keep the split
                job.set_exception(exc)

        if state.node.background(run, f"plan-{state.plan_id}"):
            state.plan_job = job

    def _compression_bits(self, epoch: int) -> tuple[list[int], list[int]]:
        """Bit widths per stage (compression.stage_bits) from the mode, the epoch and the links."""
        state = self.state
        n = len(state.worker_list)
        links: list[tuple[float, int]] = []
        step = 0.0
        if state.config.compression == "auto" and n > 1:
            problem = self.problem(self.measured_capacities() or [1.0] * n)
            # The compute a transfer can hide behind: the slowest stage's (not the predicted step, which
            # already contains the slow link itself).
            step = max(compute_time(problem, k, state.points[k], state.points[k + 1]) for k in range(n))
            sizes = [state.profile.output_bytes[state.points[k + 1] - 1] for k in range(n - 1)]
            links = [(lk.bandwidth, size) for lk, size in zip(state.links, sizes, strict=False)]
        mode, epochs = state.config.compression, state.train.epochs
        return stage_bits(
            mode,
            n,
            epoch=epoch,
            epochs=epochs,
            links=links,
            compute_seconds=step,
            milestones=state.train.lr_milestones,
        )

    def apply_compression(self, epoch: int) -> None:
        """Tell every stage its codecs when they change (start, epoch, new split, new links)."""
        state = self.state
        bits = self._compression_bits(epoch)
        if bits == state.bits:
            return
        state.bits = bits
        forward, backward = bits
        state.codecs.set_bits(forward[0], backward[0])
        if len(state.worker_list) > 1:
            state.send(
                state.topics.fixed(Family.COMMAND),
                SetCompression(
                    run_id=state.run_id, plan_id=state.plan_id, forward=forward, backward=backward
                ),
            )
        log.info(
            "compression %s: forward bits %s, backward bits %s",
            state.config.compression,
            forward,
            backward,
        )
        state.event("compression", forward=forward, backward=backward, epoch=epoch)

    def emulate(self, device: str, factor: float, batch: int) -> None:
        state = self.state
        log.info("batch %d: %s now emulates a %.1fx slower device", batch, device, factor)
        if device == state.device_id:
            state.config = state.config.model_copy(update={"slowdown": factor})
        else:
            state.send(
                state.topics.fixed(Family.COMMAND),
                Emulate(run_id=state.run_id, device=device, slowdown=factor),
            )
        state.event("slowdown", device=device, slowdown=factor, batch=batch)

    def links_for(self, new_list: list[str]) -> list[Link]:
        """Links of a new worker list: measured ones where neighbours stay neighbours; for new pairs the
        slowest measured link (no probe, to keep a recovery short)."""
        state = self.state
        old_links = dict(zip(itertools.pairwise(state.worker_list), state.links, strict=False))
        slowest = min(state.links, key=lambda lk: lk.bandwidth) if state.links else Link(1e9)
        return [old_links.get(pair, slowest) for pair in itertools.pairwise(new_list)]

    def survivor_split(self, new_list: list[str]) -> list[int]:
        """The DP over the survivors (measured capacities where known, else equal devices)."""
        caps = self.measured_capacities()
        by_device = dict(zip(self.state.worker_list, caps, strict=True)) if caps else {}
        survivor_caps = [by_device.get(d, 1.0) for d in new_list]
        problem = self.problem(survivor_caps, workers=new_list, links=self.links_for(new_list))
        return self.solve(problem)

    def record_partition(self, batch: int, reason: str, predicted: float | None = None) -> None:
        state = self.state
        entry: dict[str, Any] = {
            "batch": batch,
            "points": list(state.points),
            "plan_id": state.plan_id,
            "reason": reason,
            "chain_every": state.chain_every,  # batches between chain replications under this plan
        }
        if predicted is not None:
            entry["predicted_step"] = predicted
        state.report.partitions.append(entry)
        log.info("partition %s from batch %d (%s)", state.points, batch, reason)
