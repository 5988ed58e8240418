"""Devices that differ only by measurement noise are planned as one (ours, beyond the paper).

Pure: no torch, no I/O.

Each device's profile is a few iterations and one link probe: two identical devices come out 10-20 %
apart (a probe that caught a burst before the link's shaper, a profile taken while another process ran).
Planned apart, they get different (P, N) from that noise alone (seen: N = 12 beside N = 22 on two equal
devices at 4G), and an epoch waits for whichever of them the noise served worse. Devices whose compute and
links are all within ``tolerance`` of one another form a group; the group is planned on the mean of its
members' costs and takes one (P, N). A device 2x slower than the others stays a group of its own, so
per-device choices remain where devices really differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from statistics import fmean

from edgeagent.splitfed.cost import DeviceCosts, LayerTimes

__all__ = ["pooled", "similar_groups"]

# Per-message latencies this close count as equal whatever their ratio (a probe's jitter on a fast link).
_LATENCY_FLOOR_S = 0.002


def _compute(device: DeviceCosts) -> float:
    return sum(device.times.fwd) + sum(device.times.bwd)


def _close(a: float, b: float, tolerance: float) -> bool:
    low, high = sorted((a, b))
    return high <= low * (1.0 + tolerance) if low > 0 else high == 0


def _similar(a: DeviceCosts, b: DeviceCosts, tolerance: float) -> bool:
    return (
        a.max_split == b.max_split
        and a.times.layers == b.times.layers
        and _close(_compute(a), _compute(b), tolerance)
        and _close(a.up_bps, b.up_bps, tolerance)
        and _close(a.down_bps, b.down_bps, tolerance)
        and abs(a.latency_s - b.latency_s) <= tolerance * max(a.latency_s, b.latency_s) + _LATENCY_FLOOR_S
    )


def similar_groups(devices: Sequence[DeviceCosts], tolerance: float) -> list[tuple[str, ...]]:
    """Devices in groups, in the order given: a device joins the first group it is similar to every
    member of (compute, uplink and downlink within ``tolerance`` relative, latency within ``tolerance``
    relative + 2 ms, the same layers it can hold). ``tolerance`` 0: every device alone."""
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    groups: list[list[DeviceCosts]] = []
    for device in devices:
        home = next(
            (g for g in groups if tolerance > 0 and all(_similar(device, m, tolerance) for m in g)), None
        )
        if home is None:
            groups.append([device])
        else:
            home.append(device)
    return [tuple(m.name for m in g) for g in groups]


def _mean(rows: Sequence[tuple[float, ...]]) -> tuple[float, ...]:
    return tuple(fmean(column) for column in zip(*rows, strict=True))


def pooled(devices: Sequence[DeviceCosts], groups: Sequence[Sequence[str]]) -> list[DeviceCosts]:
    """``devices`` with each group's members given the mean of their layer times, links and latency
    (each keeps its own name, data size and memory limit)."""
    by_name = {d.name: d for d in devices}
    mean_of: dict[str, DeviceCosts] = {}
    for group in groups:
        members = [by_name[name] for name in group]
        if len(members) < 2:
            continue
        q = members[0].times.layers
        times = LayerTimes(
            _mean([m.times.fwd for m in members]),
            _mean([m.times.bwd for m in members]),
            _mean([m.times.fwd_fixed or (0.0,) * q for m in members]),
            _mean([m.times.bwd_fixed or (0.0,) * q for m in members]),
        )
        for m in members:
            mean_of[m.name] = dataclasses.replace(
                m,
                times=times,
                up_bps=fmean(x.up_bps for x in members),
                down_bps=fmean(x.down_bps for x in members),
                latency_s=fmean(x.latency_s for x in members),
            )
    return [mean_of.get(d.name, d) for d in devices]
