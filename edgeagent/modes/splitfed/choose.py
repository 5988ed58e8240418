"""Every device's (P_k, N_k) for a split-federated run (PiPar Sec. 3.3), from the profiling phase.

The server profiles the whole model here (a few training iterations at the run's batch size: per-layer
forward and backward seconds, activation and gradient bytes; :func:`edgeagent.splitfed.profile.
profile_layers`); every device does the same on its own hardware and reports its times and its emulated
links (:class:`~edgeagent.protocol.messages.SplitProfile`). The plan named by ``--splitfed-plan`` then
chooses: ``ours`` (per device, :func:`edgeagent.splitfed.plan.select`), ``paper`` (the paper's rule),
``common`` (the best (P, N) shared by all devices by ours's estimate), ``sfl`` (the best common split with
N = 1), ``fl`` (the whole model on every device) or ``fixed`` (``--split-point``/``--parallel-batches``).
Explicit ``--split-point`` or ``--parallel-batches`` override the chosen value for every device.
Everything here is pure: the run does the waiting.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from edgeagent.config import CentralConfig
from edgeagent.errors import PlanningError
from edgeagent.models import ModelSpec
from edgeagent.modes.splitfed.messages import SplitProfile, SplitUpdate
from edgeagent.splitfed.cost import Choice, DeviceCosts, LayerTimes, epoch_time, epoch_times
from edgeagent.splitfed.plan import select
from edgeagent.splitfed.profile import param_bytes, profile_layers
from edgeagent.splitfed.similar import pooled, similar_groups

# A link that is not emulated is this machine's loopback or a LAN: taken as 1 Gbit/s.
REAL_LINK_BPS = 1e9 / 8


@dataclass(frozen=True)
class ServerProfile:
    """The server's own profiling phase: layer times, bytes crossing each possible split, what it took."""

    times: LayerTimes
    act_bytes: tuple[float, ...]
    grad_bytes: tuple[float, ...]
    param_bytes: tuple[float, ...]
    seconds: float


@dataclass
class PlanInfo:
    """How the plan was made, for the report."""

    plan: str
    profiled: list[str] = field(default_factory=list)  # devices whose own profile was used
    assumed: list[str] = field(default_factory=list)  # devices planned from the server's times x slowdown
    selection_seconds: float = 0.0
    estimate: dict[str, Any] = field(default_factory=dict)
    groups: list[list[str]] = field(default_factory=list)  # ours: devices planned as one (splitfed.similar)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def needs_profiles(config: CentralConfig) -> bool:
    """Whether the plan uses measured times (the explicit flags may leave nothing to choose)."""
    if config.splitfed_plan in ("fl", "fixed"):
        return False
    if config.splitfed_plan == "exhaustive":  # no estimate, but its trials start once devices profiled
        return True
    return config.split_point is None or (config.parallel_batches is None and config.splitfed_plan != "sfl")


def exhaustive_grid(layers: int, batch_size: int, max_n: int | None) -> list[tuple[int, int]]:
    """The common (P, N) pairs the exhaustive search tries: P in [1, L) with N in [1, min(B, max_n)], and
    FL's (L, 1). The first pair is tried twice (a warm-up: a device's first round is its slowest)."""
    top = min(batch_size, max_n) if max_n else batch_size
    pairs = [(p, n) for p in range(1, layers) for n in range(1, top + 1)] + [(layers, 1)]
    return [pairs[0], *pairs]


def trial_epoch_seconds(results: dict[str, tuple[float, SplitUpdate]], batch_size: int) -> float:
    """One trial's epoch, estimated per device from its round trip ``seconds`` (weights out to update in)
    and its update: the exchange (the round trip less its training) plus its training seconds per
    iteration x the iterations of its whole shard (``samples // B``, as the device runs them); the epoch
    is the slowest device's. A trial nobody finished is infinitely slow."""
    epochs = []
    for seconds, update in results.values():
        if update.iterations < 1:
            continue
        train = min(update.train_seconds, seconds)
        full = max(1, update.samples // batch_size)
        epochs.append(seconds - train + train / update.iterations * full)
    return max(epochs) if epochs else math.inf


def profile_server(spec: ModelSpec, batch_size: int, seed: int) -> ServerProfile:
    started = time.perf_counter()
    times, act, grad = profile_layers(spec, max(2, batch_size), iterations=3, seed=seed, fit_fixed=True)
    return ServerProfile(times, act, grad, param_bytes(spec, seed=seed), time.perf_counter() - started)


def _bps(mbps: float) -> float:
    return mbps * 1e6 / 8 if mbps > 0 else REAL_LINK_BPS


def device_costs(
    device: str,
    profile: SplitProfile | None,
    server: ServerProfile,
    *,
    slowdown: float,
    unmeasured: float,
    down_bps: float,
    samples: int,
) -> DeviceCosts:
    """What the plan knows of ``device``: its own profile, or the server's times x its announced slowdown
    x ``unmeasured`` (a device that did not report in time is taken as that much slower)."""
    if profile is not None and len(profile.fwd) == server.times.layers:
        times = LayerTimes(
            tuple(profile.fwd), tuple(profile.bwd), tuple(profile.fwd_fixed), tuple(profile.bwd_fixed)
        )
        return DeviceCosts(
            device,
            times,
            profile.up_bps or REAL_LINK_BPS,
            profile.down_bps or down_bps,
            profile.samples,
            latency_s=profile.latency,
        )
    factor = slowdown * unmeasured
    times = LayerTimes(
        tuple(t * factor for t in server.times.fwd), tuple(t * factor for t in server.times.bwd)
    )
    return DeviceCosts(device, times, REAL_LINK_BPS, down_bps, samples)


def select_alike(
    costs: list[DeviceCosts], server: ServerProfile, batch: int, tolerance: float
) -> tuple[dict[str, Choice], list[tuple[str, ...]]]:
    """Ours: per-device (P, N), devices alike within ``tolerance`` planned on their mean as one."""
    groups = similar_groups(costs, tolerance)
    picked = select(
        pooled(costs, groups),
        server.times,
        server.act_bytes,
        server.grad_bytes,
        batch,
        param_bytes=server.param_bytes,
        groups=groups,
    )
    return picked, groups


def choose(
    config: CentralConfig,
    spec: ModelSpec,
    layers: int,
    devices: list[str],
    costs: list[DeviceCosts] | None,
    server: ServerProfile | None,
) -> tuple[dict[str, tuple[int, int]], PlanInfo]:
    """Every device's ``(P, N)`` by ``config.splitfed_plan`` (see the module doc)."""
    plan = config.splitfed_plan
    info = PlanInfo(plan)
    batch = config.train.batch_size
    if config.split_point is not None and config.split_point > layers:
        raise PlanningError(f"--split-point {config.split_point}: model {spec.name!r} has {layers} layers")
    if config.parallel_batches is not None and config.parallel_batches > batch:
        raise PlanningError(f"--parallel-batches {config.parallel_batches} exceeds the batch size {batch}")
    chosen: dict[str, tuple[int, int]]
    if plan == "fl":
        chosen = {d: (layers, 1) for d in devices}
    elif plan == "fixed" or costs is None or server is None:
        chosen = {d: (config.split_point or 1, config.parallel_batches or 1) for d in devices}
    else:
        started = time.perf_counter()
        args = (costs, server.times, server.act_bytes, server.grad_bytes, batch)
        if plan == "sfl":  # split learning: a server-side part (P < L), or it would be FL
            if layers < 2:
                raise PlanningError(f"SFL needs a model of 2 layers or more; {spec.name!r} has {layers}")
            best = min(
                range(1, layers),
                key=lambda p: epoch_time(
                    *args, {d.name: Choice(p, 1) for d in costs}, param_bytes=server.param_bytes
                ),
            )
            picked = {d.name: Choice(best, 1) for d in costs}
        elif plan == "ours":
            picked, groups = select_alike(costs, server, batch, config.splitfed_similar)
            info.groups = [list(g) for g in groups if len(g) > 1]
        else:  # paper: the paper's rule per device; common: ours's best (P, N) shared by every device
            picked = select(
                *args,
                per_device=plan == "paper",
                method="paper" if plan == "paper" else "ours",
                param_bytes=server.param_bytes,
            )
        info.selection_seconds = time.perf_counter() - started
        info.estimate = {
            "epoch_seconds": epoch_times(*args, picked, param_bytes=server.param_bytes),
            "devices": {
                d.name: {
                    "compute_s": sum(d.times.fwd) + sum(d.times.bwd),  # one iteration at B, all layers
                    "up_bps": d.up_bps,
                    "down_bps": d.down_bps,
                    "latency_s": d.latency_s,
                }
                for d in costs
            },
        }
        chosen = {d: (picked[d].split, picked[d].n) for d in devices}
    if config.split_point is not None and plan != "fl":
        chosen = {d: (config.split_point, n) for d, (_, n) in chosen.items()}
    if config.parallel_batches is not None and plan not in ("fl", "sfl"):
        chosen = {d: (p, config.parallel_batches) for d, (p, _) in chosen.items()}
    if plan == "sfl":
        chosen = {d: (p, 1) for d, (p, _) in chosen.items()}
    return chosen, info


__all__ = [
    "REAL_LINK_BPS",
    "PlanInfo",
    "ServerProfile",
    "choose",
    "device_costs",
    "exhaustive_grid",
    "needs_profiles",
    "profile_server",
    "select_alike",
    "trial_epoch_seconds",
]
