"""PiPar's cost model and the choice of (P, N) per device (papers/003 Sec. 3.2-3.3, eq. 2 and 5-14).

Pure: no torch, no I/O. The cost model itself (eq. 5-14) is in :mod:`.cost`.

Note: the stage graph of one iteration (Table 1 of the paper is garbled; this is Sec. 3.2.2 and Fig. 2(b)).
    For mini-batches n = 1..N of one device (``f`` forward, ``b`` backward, ``c`` device, ``s`` server,
    ``u`` upload of the activations, ``d`` download of their gradients)::

        f_n^c  after f_{n-1}^c                      (the device forwards in sequence)
        u_n    after f_n^c and u_{n-1}              (one uplink, in order)
        f_n^s  after u_n and b_{n-1}^s              (the server works on one mini-batch at a time)
        b_n^s  after f_n^s
        d_n    after b_n^s and d_{n-1}              (one downlink, in order)
        b_n^c  after d_n, b_{n-1}^c and f_N^c       (backwards start once every forward is done)

    The iteration ends with b_N^c. ``T(r) = t(r) + max over prev(r) of T`` (eq. 11-13) is computed once
    per stage in the order above, so the estimate is linear in N (PiPar's code recurses without a cache,
    exponential in N). When P = Q nothing crosses the link per mini-batch (FL): u, f^s, b^s and d are 0.

Note: what ours adds to the paper's estimate, each switched off by the defaults of the pure functions.
    * Server contention. The server trains the K server-side models at once (Fig. 3c); the paper
      estimates each device alone (``server_share=1``). :func:`server_shares` gives device k the share
      ``max(1/K, 1 - sum of the other devices' server loads)`` (processor sharing), where a device's load
      is its server work per iteration over its iteration time, found by a damped fixed point.
    * The real mini-batch size floor(B/N) (eq. 2) when ``batch_size`` is given, instead of B/N, and the
      iterations per epoch floor(|D_k| / (N floor(B/N))) of Algorithm 1.
    * Per-call costs that do not shrink with the mini-batch: ``LayerTimes.fwd_fixed``/``bwd_fixed`` and
      ``DeviceCosts.latency_s`` per message. Without them the estimate only ever favours a larger N.
    * The FedAvg exchange of the device-side model each epoch (``param_bytes``): what makes FL costly.
    ``method="ours"`` then searches P and N per device around eq. 14 by coordinate descent on the
    (slowest device's epoch, sum of epochs) of that estimate, starting from the paper's choice and the best
    common (P, N), so by the estimate it is never worse than either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from edgeagent.splitfed.cost import (
    Choice,
    Choices,
    DeviceCosts,
    LayerTimes,
    epoch_times,
    estimate_n,
    iteration_time,
    server_shares,
)

__all__ = ["baseline", "exhaustive", "select"]

_SEARCH_PASSES = 3


def _paper_estimate(
    device: DeviceCosts,
    server: LayerTimes,
    act: Sequence[float],
    grad: Sequence[float],
    batch: int,
    c: Choice,
) -> float:
    """The paper's own epoch estimate: |D|/B iterations of eq. 11-13 with 1/N and the server alone."""
    return (device.samples // batch) * iteration_time(device, server, act, grad, c)


def _paper_candidates(
    device: DeviceCosts, server: LayerTimes, act: Sequence[float], grad: Sequence[float], batch: int
) -> list[Choice]:
    """Sec. 3.3.3's shortlist: every P in [1, Q'] with eq. 14's N."""
    return [
        Choice(p, estimate_n(device, server, act, grad, p, batch_size=batch))
        for p in range(1, device.max_split + 1)
    ]


def _select_paper(
    devices: Sequence[DeviceCosts],
    server: LayerTimes,
    act: Sequence[float],
    grad: Sequence[float],
    batch: int,
    per_device: bool,
) -> dict[str, Choice]:
    if per_device:
        out = {}
        for d in devices:
            estimates = [
                (_paper_estimate(d, server, act, grad, batch, c), c)
                for c in _paper_candidates(d, server, act, grad, batch)
            ]
            out[d.name] = min(estimates, key=lambda pair: pair[0])[1]
        return out
    splits = _common_splits(devices)
    shortlist = {
        c for d in devices for c in _paper_candidates(d, server, act, grad, batch) if c.split in splits
    }
    best = min(
        sorted(shortlist, key=lambda c: (c.split, c.n)),
        key=lambda c: max(_paper_estimate(d, server, act, grad, batch, c) for d in devices),
    )
    return {d.name: best for d in devices}


def _common_splits(devices: Sequence[DeviceCosts]) -> range:
    """The split points P that every device can hold: 1 to the smallest Q'."""
    return range(1, min(d.max_split for d in devices) + 1)


class _Evaluator:
    """The estimate that selections are compared by: (slowest epoch, sum of epochs), with contention."""

    def __init__(
        self,
        devices: Sequence[DeviceCosts],
        server: LayerTimes,
        act: Sequence[float],
        grad: Sequence[float],
        batch: int,
        param_bytes: Sequence[float] | None,
    ) -> None:
        self.devices, self.server, self.act, self.grad = devices, server, act, grad
        self.batch, self.param_bytes = batch, param_bytes

    def __call__(self, choices: Choices) -> tuple[float, float]:
        times = epoch_times(
            self.devices, self.server, self.act, self.grad, self.batch, choices, param_bytes=self.param_bytes
        )
        return max(times.values()), sum(times.values())

    def window(self, device: DeviceCosts, split: int, share: float) -> range:
        """N around eq. 14 (on the shared server): 1 .. min(B, 2 N14 + 8)."""
        n14 = estimate_n(
            device, self.server, self.act, self.grad, split, batch_size=self.batch, server_share=share
        )
        return range(1, min(self.batch, 2 * n14 + 8) + 1)

    def best_common(self, candidates: Iterable[Choice]) -> dict[str, Choice]:
        best: tuple[tuple[float, float], dict[str, Choice]] | None = None
        for c in candidates:
            choices = {d.name: c for d in self.devices}
            score = self(choices)
            if best is None or score < best[0]:
                best = (score, choices)
        if best is None:
            raise ValueError("no candidate (P, N) to choose from")
        return best[1]

    def descend(
        self,
        start: dict[str, Choice],
        candidates: Callable[[DeviceCosts, float], Iterable[Choice]],
        units: Sequence[tuple[str, ...]],
    ) -> dict[str, Choice]:
        """Coordinate descent: each unit (a device, or a group of alike devices) in turn takes its best
        candidate given the others'."""
        by_name = {d.name: d for d in self.devices}
        current, score = dict(start), self(start)
        for _ in range(_SEARCH_PASSES):
            improved = False
            for unit in units:
                d = by_name[unit[0]]
                shares = server_shares(self.devices, self.server, self.act, self.grad, self.batch, current)
                for c in candidates(d, shares[d.name]):
                    trial = {**current, **dict.fromkeys(unit, c)}
                    trial_score = self(trial)
                    if trial_score < score:
                        current, score, improved = trial, trial_score, True
            if not improved:
                break
        return current


def select(
    devices: Sequence[DeviceCosts],
    server: LayerTimes,
    act_bytes: Sequence[float],
    grad_bytes: Sequence[float],
    batch_size: int,
    *,
    per_device: bool = True,
    method: Literal["ours", "paper"] = "ours",
    param_bytes: Sequence[float] | None = None,
    groups: Sequence[Sequence[str]] | None = None,
) -> dict[str, Choice]:
    """(P_k, N_k) for every device; ``per_device=False`` gives all devices one (P, N); ``groups`` (ours):
    the devices of a group take one (P, N) (:mod:`.similar`; default: every device on its own).

    ``"paper"``: Sec. 3.3.3 (each P in [1, Q'] with eq. 14's N, the best by the paper's estimate).
    ``"ours"``: the search of the module note over the contended estimate (:func:`epoch_time`).
    """
    if not devices:
        raise ValueError("select needs at least one device")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    paper = _select_paper(devices, server, act_bytes, grad_bytes, batch_size, per_device)
    if method == "paper":
        return paper
    if method != "ours":
        raise ValueError(f"unknown method {method!r}; allowed: 'ours', 'paper'")
    ev = _Evaluator(devices, server, act_bytes, grad_bytes, batch_size, param_bytes)
    shares = server_shares(devices, server, act_bytes, grad_bytes, batch_size, paper)
    splits = _common_splits(devices)
    common = sorted(
        {Choice(p, n) for d in devices for p in splits for n in ev.window(d, p, shares[d.name])},
        key=lambda c: (c.split, c.n),
    )
    best_common = ev.best_common([*common, *set(paper.values())])
    if not per_device:
        return best_common
    units = [tuple(g) for g in groups] if groups is not None else [(d.name,) for d in devices]
    named = sorted(name for g in units for name in g)
    if named != sorted(d.name for d in devices):
        raise ValueError(f"groups {units} must hold every device exactly once")
    grouped_paper = {name: paper[unit[0]] for unit in units for name in unit}
    start = min((grouped_paper, best_common), key=ev)

    def candidates(d: DeviceCosts, share: float) -> Iterable[Choice]:
        for p in range(1, d.max_split + 1):
            for n in ev.window(d, p, share):
                yield Choice(p, n)

    return ev.descend(start, candidates, units)


def exhaustive(
    devices: Sequence[DeviceCosts],
    server: LayerTimes,
    act_bytes: Sequence[float],
    grad_bytes: Sequence[float],
    batch_size: int,
    *,
    param_bytes: Sequence[float] | None = None,
) -> dict[str, Choice]:
    """The best common (P, N) over all of [1, Q'] x [1, B] by :func:`epoch_time` (the paper's T_opt)."""
    ev = _Evaluator(devices, server, act_bytes, grad_bytes, batch_size, param_bytes)
    return ev.best_common(Choice(p, n) for p in _common_splits(devices) for n in range(1, batch_size + 1))


def baseline(
    kind: Literal["fl", "sfl"],
    devices: Sequence[DeviceCosts],
    server: LayerTimes,
    act_bytes: Sequence[float],
    grad_bytes: Sequence[float],
    batch_size: int,
    *,
    param_bytes: Sequence[float] | None = None,
) -> dict[str, Choice]:
    """FL: the whole model on every device (P = Q, N = 1). SFL: the best common split P with N = 1."""
    if kind == "fl":
        short = [d.name for d in devices if d.max_split < d.times.layers]
        if short:
            raise ValueError(f"FL needs the whole model on every device; {short} hold fewer layers")
        return {d.name: Choice(d.times.layers, 1) for d in devices}
    if kind == "sfl":
        ev = _Evaluator(devices, server, act_bytes, grad_bytes, batch_size, param_bytes)
        return ev.best_common(Choice(p, 1) for p in _common_splits(devices))
    raise ValueError(f"unknown baseline {kind!r}; allowed: 'fl', 'sfl'")
