"""Split-federated training's plan on the server (PiPar Sec. 3.3): the profiling phase and every
device's (P_k, N_k) (:func:`~edgeagent.modes.splitfed.choose.choose`), the exhaustive search run for
real (``--splitfed-plan exhaustive``), and ours's calibration and re-plan after every epoch.

A mixin of :class:`~edgeagent.modes.splitfed.central.SplitFedRun`: the rounds are the run's, events and
progress its lifecycle's; the pure parts are in :mod:`edgeagent.modes.splitfed.choose` and
:mod:`edgeagent.splitfed`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from edgeagent.errors import TrainingError
from edgeagent.modes.splitfed.choose import (
    REAL_LINK_BPS,
    ServerProfile,
    choose,
    device_costs,
    exhaustive_grid,
    needs_profiles,
    profile_server,
    select_alike,
    trial_epoch_seconds,
)
from edgeagent.splitfed import trial
from edgeagent.splitfed.cost import Choice, DeviceCosts, calibrate, epoch_time

if TYPE_CHECKING:
    from edgeagent.config import CentralConfig, TrainConfig
    from edgeagent.models import ModelSpec
    from edgeagent.modes.splitfed.messages import SplitProfile, SplitUpdate
    from edgeagent.roles.central.lifecycle import RunLifecycle
    from edgeagent.roles.central.node import Central

log = logging.getLogger("edgeagent.roles.central")


class SplitFedPlanning:
    """Every device's (P, N) for a split-federated run, before and between its epochs."""

    central: Central
    life: RunLifecycle  # the run's events and progress (roles/central/lifecycle.py)
    config: CentralConfig
    train: TrainConfig
    spec: ModelSpec
    layers: int
    devices: list[str]
    assigned: set[str]
    profiles: dict[str, SplitProfile]
    updates: dict[str, SplitUpdate]
    device_seconds: dict[str, float]
    servers: dict[str, Any]
    epoch: int
    epochs: list[dict[str, Any]]
    iterations: int
    loss_sum: float
    loss_count: int
    plan: dict[str, tuple[int, int]]
    plan_info: dict[str, Any]
    costs: list[DeviceCosts] | None  # what the plan knows of every device (ours: calibrated)
    server_profile: ServerProfile | None
    trial_schedules: dict[str, list[int]]
    tried: dict[str, tuple[int, int]]

    # The run's (SplitFedRun defines them), used here.
    def collect_weights(self) -> dict[str, Any]:
        raise NotImplementedError

    def _participants(self, epoch: int) -> list[str]:
        raise NotImplementedError

    def _round(
        self,
        epoch: int,
        participants: list[str],
        state: dict[str, Any],
        plan: dict[str, tuple[int, int]],
        iterations: int = 0,
        schedules: dict[str, list[int]] | None = None,
    ) -> None:
        raise NotImplementedError

    def _profile_server(self) -> None:
        """This node's own profile, taken before any device is assigned (devices profile once assigned):
        profiled alone, neither side counts the other's use of a shared machine's cores."""
        if needs_profiles(self.config):
            self.server_profile = profile_server(self.spec, self.train.batch_size, self.train.seed)

    def _plan(self) -> None:
        """The profiling phase (if the plan needs it) and every device's (P, N)."""
        config, central = self.config, self.central
        costs = None
        server = self.server_profile
        waited = time.perf_counter()
        if server is not None:
            slowest = max([1.0, *(central.workers[d].slowdown for d in self.devices if d in central.workers)])
            wait = max(config.batch_timeout, config.unmeasured_slowdown * slowest * server.seconds)
            try:
                central.wait_until(
                    lambda: all(d in self.profiles for d in self.assigned),
                    wait,
                    lambda: f"profiles of {sorted(self.assigned - set(self.profiles))} did not come",
                )
            except TrainingError as exc:
                log.warning("%s: those devices are planned from this node's times x their slowdown", exc)
            known = [p.samples for p in self.profiles.values()] or [1]
            costs = [
                device_costs(
                    d,
                    self.profiles.get(d),
                    server,
                    slowdown=central.workers[d].slowdown if d in central.workers else 1.0,
                    unmeasured=config.unmeasured_slowdown,
                    down_bps=config.link_mbps * 1e6 / 8 if config.link_mbps else REAL_LINK_BPS,
                    samples=max(known),
                )
                for d in self.devices
            ]
        self.costs, self.server_profile = costs, server
        if config.splitfed_plan == "exhaustive":
            self.plan, self.plan_info = self._exhaustive()
        else:
            self.plan, info = choose(config, self.spec, self.layers, self.devices, costs, server)
            info.profiled = sorted(d for d in self.devices if d in self.profiles)
            info.assumed = sorted(d for d in self.devices if costs is not None and d not in self.profiles)
            self.plan_info = info.to_dict()
        # PiPar Sec. 5.6.3 counts the profiling iteration in the selection's overhead: the wait for it here.
        self.plan_info["profiling_seconds"] = (
            time.perf_counter() - waited - self.plan_info.get("selection_seconds", 0.0)
        )
        if self._replans() and config.splitfed_trial:
            self.trial_schedules = self._trial_schedules()
        log.info("split-federated plan %s: %s", config.splitfed_plan, self.plan)
        self.life.event(
            "splitfed-plan", {"plan": {d: list(pn) for d, pn in self.plan.items()}, **self.plan_info}
        )

    def _replan(self, epoch: int) -> None:
        """Ours, beyond the paper (which selects once, before training): every device's costs corrected by
        the epoch just measured (:func:`~edgeagent.splitfed.cost.calibrate`: its layer times scaled to the
        compute it measured) and (P_k, N_k) chosen again; the new plan is taken only if the
        corrected estimate makes it at least 5 % faster than the current one. A plan is per epoch
        anyway (``split_round``), so switching costs nothing."""
        config, server = self.config, self.server_profile
        if not self._replans() or self.costs is None or server is None or self._take_trial(epoch):
            return
        measured = self.epochs[-1]["devices"]
        batch = self.train.batch_size
        self.costs = [
            calibrate(
                d,
                Choice(measured[d.name]["split"], measured[d.name]["parallel"]),
                batch,
                measured[d.name]["compute_seconds"],
                measured[d.name]["iterations"],
            )
            if d.name in measured
            else d
            for d in self.costs
        ]
        args = (self.costs, server.times, server.act_bytes, server.grad_bytes, batch)
        current = {d.name: Choice(*self.plan[d.name]) for d in self.costs}
        before = epoch_time(*args, current, param_bytes=server.param_bytes)
        picked, groups = select_alike(self.costs, server, batch, config.splitfed_similar)
        for name, choice in picked.items():  # the N a trial measured fastest at that P beats the estimate's
            if name in self.tried and self.tried[name][0] == choice.split:
                picked[name] = Choice(choice.split, self.tried[name][1])
        after = epoch_time(*args, picked, param_bytes=server.param_bytes)
        if after >= 0.95 * before:
            return
        plan = {d: (picked[d].split, picked[d].n) for d in self.devices}
        log.info(
            "split-federated plan after epoch %d, calibrated by its times: %s (estimate %.2f s per epoch, "
            "%.2f s with the plan it replaces)",
            epoch,
            plan,
            after,
            before,
        )
        self.plan_info.setdefault("replans", []).append(
            {
                "after_epoch": epoch,
                "plan": {d: list(pn) for d, pn in plan.items()},
                "estimate": after,
                "was": before,
                "groups": [list(g) for g in groups if len(g) > 1],
            }
        )
        self.life.event(
            "splitfed-plan", {"after_epoch": epoch, "plan": {d: list(pn) for d, pn in plan.items()}}
        )
        self.plan = plan

    def _replans(self) -> bool:
        """Whether ours's plan is revisited between epochs (not with --split-point/--parallel-batches)."""
        config = self.config
        explicit = config.split_point is not None or config.parallel_batches is not None
        return config.splitfed_plan == "ours" and self.costs is not None and not explicit

    def _trial_schedules(self) -> dict[str, list[int]]:
        """Ours's trial of N (:mod:`edgeagent.splitfed.trial`): each device's N per iteration of the first
        epoch, for those with enough iterations (``samples // B``) to try every candidate once."""
        batch = self.train.batch_size
        out = {}
        for cost in self.costs or []:
            split, n = self.plan[cost.name]
            plan = trial.schedule(n, cost.samples // batch) if split < self.layers else []
            if plan:
                out[cost.name] = plan
        return out

    def _take_trial(self, epoch: int) -> bool:
        """After the trial epoch: every device (every group planned as one, pooled) keeps the N whose
        iterations were fastest (:func:`edgeagent.splitfed.trial.pick`); False when none ran."""
        schedules, self.trial_schedules = self.trial_schedules, {}
        if not schedules:
            return False
        grouped = [g for g in self.plan_info.get("groups", []) if len(g) > 1]
        units = grouped + [[d] for d in schedules if not any(d in g for g in grouped)]
        plan, seconds = dict(self.plan), {}
        for unit in units:
            runs = [
                (schedules[d], self.updates[d].iteration_seconds)
                for d in unit
                if d in schedules and d in self.updates
            ]
            if not runs:
                continue
            split, n = self.plan[unit[0]]
            best = trial.pick(runs, n)
            for d in unit:
                plan[d] = self.tried[d] = (split, best)
            for d in unit:
                if d in self.updates:
                    seconds[d] = [round(t, 4) for t in self.updates[d].iteration_seconds]
        self.plan_info["trial"] = {
            "epoch": epoch,
            "schedules": schedules,
            "iteration_seconds": seconds,
            "picked": {d: list(pn) for d, pn in self.tried.items()},
        }
        if plan != self.plan:
            log.info("split-federated plan after epoch %d's trial of N: %s (was %s)", epoch, plan, self.plan)
            listed = {d: list(pn) for d, pn in plan.items()}
            self.life.event("splitfed-plan", {"after_epoch": epoch, "plan": listed, "trial": True})
        self.plan = plan
        return True

    def _exhaustive(self) -> tuple[dict[str, tuple[int, int]], dict[str, Any]]:
        """The paper's exhaustive search (Sec. 5.4, the baseline of eq. 28), run for real: every common
        (P, N) of :func:`splitfed_plan.exhaustive_grid` trained for ``--exhaustive-iterations`` iterations
        on every device from the global model (then discarded); a pair's epoch is estimated as its
        exchange (round trip less training) plus its training seconds per iteration x the epoch's
        iterations; the fastest pair is every device's."""
        config, batch = self.config, self.train.batch_size
        grid = exhaustive_grid(self.layers, batch, config.exhaustive_max_n)
        state = self.collect_weights()
        started = time.perf_counter()
        trials: list[dict[str, Any]] = []
        for t, (split, parallel) in enumerate(grid):
            participants = self._participants(-1 - t)
            self._round(
                self.epoch,
                participants,
                state,
                dict.fromkeys(participants, (split, parallel)),
                config.exhaustive_iterations,
            )
            seconds = trial_epoch_seconds(
                {d: (self.device_seconds[d], self.updates[d]) for d in participants if d in self.updates},
                batch,
            )
            if t == 0:  # the warm-up
                continue
            trials.append({"split": split, "parallel": parallel, "epoch_seconds": seconds})
            log.info("exhaustive search: (P, N) = (%d, %d) -> %.2f s per epoch", split, parallel, seconds)
            self.life.progress(
                {
                    "batch": t,
                    "total": len(grid) - 1,
                    "description": f"exhaustive search (P, N) = ({split}, {parallel})",
                }
            )
        self.servers, self.updates = {}, {}
        self.iterations, self.loss_sum, self.loss_count = 0, 0.0, 0
        best = min(trials, key=lambda r: r["epoch_seconds"])
        info = {
            "plan": "exhaustive",
            "selection_seconds": time.perf_counter() - started,
            "estimate": {"trials": trials, "iterations": config.exhaustive_iterations},
        }
        return dict.fromkeys(self.devices, (best["split"], best["parallel"])), info
