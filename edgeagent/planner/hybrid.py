"""Hybrid pipelines: the partition DP of :mod:`edgeagent.planner.dp` where a stage may be held by several
devices (data parallelism inside a pipeline stage).

Conventions as in :mod:`edgeagent.planner.dp`: ``points`` has ``n + 1`` entries and stage ``k`` owns
layers ``[points[k], points[k+1])``; ``groups[k]`` lists the device indices (ascending) holding stage
``k``. ``devices[0]`` is the central node: stage 0 is the central node alone, with at least one layer,
unless ``replicate_first`` lets stage 0 be the central node (first) plus helpers (the central node holds
the data and sends each helper its rows of every batch's input; such a stage 0 is never the only stage).
Every stage has at least one layer and one device; devices may be left out (unused); the number of
stages is free (``1 .. min(devices, layers)``). Every transfer goes device -> MQTT broker -> device, so
a device's ``bandwidth``/``latency`` describe its own link to the broker.

Cost model per batch (``T(s, e) = sum(layer_times[s:e])`` on the central node, ``C_d`` the capacity
of device ``d``, ``B_d`` its bandwidth, ``l_d`` its latency):

* **Compute.** Stage ``k`` with group ``G`` and layers ``[s, e)`` splits every batch's rows among ``G``
  in proportion to speed (uneven micro-batches): device ``d`` takes the share ``C_G / C_d`` of the rows,
  where ``C_G = 1 / sum_{d in G} 1 / C_d`` is the group's effective capacity (``C_G = C_d`` for a
  single device). Compute time ``T(s, e) * C_G``.
* **Gradient exchange.** Replicas exchange their parameter gradients through the broker once per batch:
  with ``r = |G| >= 2`` and ``P`` the parameter bytes of ``[s, e)`` (0 without ``param_bytes``), every
  replica uploads ``P`` once and downloads ``(r - 1) P``, so ``sync = max_{d in G} (r P / B_d + l_d)``;
  0 for ``r = 1``. Stage time = compute + sync.
* **Links.** Between consecutive stages ``A`` and ``B`` with cut ``s`` (the first layer of ``B``) the
  tensor is ``D = output_bytes[s - 1] * activation_factor``. Forward, every sender ``a`` in ``A`` uploads
  its share of the rows and every receiver ``b`` in ``B`` downloads the whole ``D`` (all replicas of a
  stage subscribe to the whole batch, so that a survivor can take over a dead replica's rows)::

      t_fwd = max( max_{a in A} share_a D / B_a,  max_{b in B} D / B_b ) + max_{d in A u B} l_d

  and backward the same with the roles swapped (``B`` sends its rows' input gradients, ``A`` downloads
  all of them). The link term is ``t_fwd + t_bwd``. For single-device stages this is exactly
  :func:`edgeagent.planner.dp.comm_time` ``= 2 * (latency + D / bandwidth)`` of a ``dp.Link`` with the
  smaller of the two bandwidths and the larger of the two latencies.
* **Input rows (stage 0 replicated, ``replicate_first``).** The central node sends every helper of stage 0
  its rows of the batch's input (``I = input_bytes``, labels included): the central node uploads the
  helpers' shares, each helper downloads its own, ``t_in = max((1 - share_0) I / B_0, max_{h} share_h I /
  B_h) + max_h l_h``; a term of the bottleneck of its own (0 when stage 0 is the central node alone).
  Stage 0's members exchange their parameter gradients as every replicated stage does.
* **Memory.** Every member of ``G`` holds the stage's full parameters and stashed versions: the stage
  memory of :func:`edgeagent.planner.dp.stage_memory`, ``P * (f + 3) + f * A`` with
  ``f = max(1, bound - k)`` batches in flight on stage ``k`` (``bound = in_flight``, or the number of
  stages when 0), must be ``<=`` every member's ``memory_limit``.

The objective is the bottleneck: the largest stage time and link term (as :func:`dp.predict`). With only
single-device stages the whole model is :func:`dp.predict` / :func:`dp.fits` bit for bit.

Tie rule (the same in :func:`solve_hybrid` and :func:`brute_force_hybrid`). Every plan whose time is
within a relative ``1e-12`` of the optimum counts as optimal; among those, the one with

1. the fewest devices used, then
2. the fewest stages, then
3. the latest cuts read from the last (as :func:`dp.solve`: the latest last cut, then the latest cut
   before it, ...), then
4. the lexicographically smallest ``groups`` (stage by stage, each an ascending tuple of indices).

The exact DP is :func:`edgeagent.planner.hybrid_dp.solve_hybrid`; :func:`brute_force_hybrid` here
checks it on small cases.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from edgeagent.planner.dp import memory_bytes, prefix_table
from edgeagent.planner.partition import check_points

INF = math.inf
TIE_TOLERANCE = 1e-12  # relative: plans within it of the optimum are ties

Groups = tuple[tuple[int, ...], ...]
# The tie key: (devices used, stages, negated points from the last, groups); smaller is better.
TieKey = tuple[int, int, tuple[int, ...], Groups]
Counts = tuple[int, ...]  # devices per type; type 0 is the central node


@dataclass(frozen=True)
class Device:
    """One device: its speed relative to the central node and its own link to the broker."""

    capacity: float  # C_d: time per unit of work relative to the central node's layer_times; > 0
    bandwidth: float = math.inf  # bytes/s of the device's link to the broker
    latency: float = 0.0  # seconds per message on that link
    memory_limit: float | None = None  # bytes; None = unlimited

    def __post_init__(self) -> None:
        if not (math.isfinite(self.capacity) and self.capacity > 0 and math.isfinite(1.0 / self.capacity)):
            raise ValueError(
                f"device capacity {self.capacity} must be finite and > 0 (its time per unit of work "
                "relative to the central node, 1.0 = as fast)"
            )
        if not self.bandwidth > 0:  # also rejects NaN
            raise ValueError(f"device bandwidth {self.bandwidth} bytes/s must be > 0 (math.inf = free)")
        if not (math.isfinite(self.latency) and self.latency >= 0):
            raise ValueError(f"device latency {self.latency} s must be finite and >= 0")
        if self.memory_limit is not None and not self.memory_limit >= 0:
            raise ValueError(f"device memory_limit {self.memory_limit} bytes must be >= 0 or None")


def _check_values(name: str, values: Sequence[float]) -> None:
    for i, v in enumerate(values):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name}[{i}] = {v} must be finite and >= 0")


@dataclass(frozen=True)
class HybridProblem:
    """Everything the hybrid planner needs; sequences are stored as tuples (lists are converted)."""

    layer_times: tuple[float, ...]  # forward+backward seconds per batch of each layer on the central node
    output_bytes: tuple[int, ...]  # D_j: bytes of each layer's output per batch
    devices: tuple[Device, ...]  # devices[0] is the central node (stage 0, alone)
    param_bytes: tuple[int, ...] | None = None  # per layer: memory limits and the replicas' gradient sync
    in_flight: int = 0  # batches in flight on stage 0; 0 = the number of stages (as dp.Problem)
    activation_factor: float = 1.0  # compressed / raw size of activations and gradients on the wire
    max_replicas: int | None = None  # most devices per stage; None = no bound
    # The smallest share of a batch's rows a member of a replicated stage may get (batch normalisation
    # over a handful of rows is noise: the central node asks for 8 rows when the model normalises).
    min_share: float = 0.0
    # Stage 0 may be the central node plus helpers fed with input rows (False: the central node alone).
    replicate_first: bool = False
    input_bytes: int = 0  # bytes of one batch's input rows and labels as sent to stage 0's helpers

    def __post_init__(self) -> None:
        for name in ("layer_times", "output_bytes", "devices", "param_bytes"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        num_layers = len(self.layer_times)
        if num_layers < 1:
            raise ValueError("a problem needs at least 1 layer, got 0")
        if len(self.output_bytes) != num_layers:
            raise ValueError(f"{len(self.output_bytes)} output sizes for {num_layers} layers")
        if not self.devices:
            raise ValueError("a problem needs at least 1 device (devices[0] is the central node), got 0")
        if not all(isinstance(d, Device) for d in self.devices):
            raise ValueError("devices must be Device instances")
        _check_values("layer_times", self.layer_times)
        _check_values("output_bytes", self.output_bytes)
        if self.param_bytes is not None:
            if len(self.param_bytes) != num_layers:
                raise ValueError(f"{len(self.param_bytes)} parameter sizes for {num_layers} layers")
            _check_values("param_bytes", self.param_bytes)
        self._check_options()

    def _check_options(self) -> None:
        if self.in_flight < 0:
            raise ValueError(f"in_flight {self.in_flight} must be >= 0 (0 = number of stages)")
        if not (math.isfinite(self.activation_factor) and self.activation_factor >= 0):
            raise ValueError(f"activation_factor {self.activation_factor} must be finite and >= 0")
        if self.max_replicas is not None and self.max_replicas < 1:
            raise ValueError(f"max_replicas {self.max_replicas} must be >= 1 or None (no bound)")
        if not 0.0 <= self.min_share <= 1.0:
            raise ValueError(f"min_share {self.min_share} must be in [0, 1]")
        if self.input_bytes < 0:
            raise ValueError(f"input_bytes {self.input_bytes} must be >= 0")

    @property
    def num_layers(self) -> int:
        return len(self.layer_times)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def bound(self, num_stages: int) -> int:
        """Batches in flight on stage 0 (``in_flight``, or ``num_stages`` when it is 0)."""
        return self.in_flight or num_stages


@dataclass(frozen=True)
class HybridPlan:
    """A split into stages, the devices holding each stage and their shares of every batch's rows."""

    points: tuple[int, ...]  # n + 1 partition points
    groups: Groups  # device indices per stage, ascending; groups[0] starts with 0 (the central node)
    shares: tuple[tuple[float, ...], ...]  # per stage, per member (order of groups); sums to 1
    time: float  # predicted bottleneck seconds per batch

    def __post_init__(self) -> None:
        object.__setattr__(self, "points", tuple(self.points))
        object.__setattr__(self, "groups", tuple(tuple(g) for g in self.groups))
        object.__setattr__(self, "shares", tuple(tuple(s) for s in self.shares))
        if not len(self.points) - 1 == len(self.groups) == len(self.shares) >= 1:
            raise ValueError(
                f"{len(self.points)} points, {len(self.groups)} groups and {len(self.shares)} share "
                "lists do not describe the same stages (need n + 1, n, n with n >= 1)"
            )
        if self.groups[0][:1] != (0,):
            raise ValueError(
                f"stage 0 must be the central node or start with it, got groups[0] = {self.groups[0]}"
            )
        for k, (group, share) in enumerate(zip(self.groups, self.shares, strict=True)):
            if len(group) != len(share):
                raise ValueError(f"stage {k}: {len(share)} shares for {len(group)} devices")

    @property
    def num_stages(self) -> int:
        return len(self.groups)

    @property
    def replicated(self) -> tuple[int, ...]:
        """Indices of the stages held by more than one device."""
        return tuple(k for k, group in enumerate(self.groups) if len(group) > 1)

    def used(self) -> tuple[int, ...]:
        """The devices holding a stage, ascending."""
        return tuple(sorted(d for group in self.groups for d in group))

    def unused(self, num_devices: int) -> tuple[int, ...]:
        """The devices among ``0 .. num_devices - 1`` that hold no stage."""
        taken = set(self.used())
        return tuple(d for d in range(num_devices) if d not in taken)


# --------------------------------------------------------------------------------------------------
# Group statistics and the cost of stages and links


@dataclass(frozen=True)
class GroupStats:
    """What the cost model needs of one group (a multiset of device types)."""

    size: int
    capacity: float  # C_G = 1 / sum 1/C_d (C_d itself for one device)
    share_of: tuple[float, ...]  # per type: a member's share of the rows (0.0 for absent types)
    senders: tuple[tuple[float, float], ...]  # (share, bandwidth) per type present
    min_bandwidth: float
    max_latency: float
    sync: tuple[tuple[float, float], ...]  # (bandwidth, latency) per type present; () for one device
    limit: float  # the smallest memory limit of the members (inf when none)


def _make_stats(reps: Sequence[Device], counts: Counts) -> GroupStats:
    present = [(t, reps[t]) for t, c in enumerate(counts) if c]
    size = sum(counts)
    if size == 1:
        capacity = present[0][1].capacity
    else:
        total = 0.0
        # Ascending inverses: the sum depends only on the multiset of capacities, not on type order.
        for inverse in sorted(1.0 / d.capacity for t, d in present for _ in range(counts[t])):
            total += inverse
        capacity = 1.0 / total
    share_of = [0.0] * len(counts)
    for t, d in present:
        share_of[t] = 1.0 if size == 1 else capacity / d.capacity
    limits = [d.memory_limit for _, d in present if d.memory_limit is not None]
    return GroupStats(
        size=size,
        capacity=capacity,
        share_of=tuple(share_of),
        senders=tuple((share_of[t], d.bandwidth) for t, d in present),
        min_bandwidth=min(d.bandwidth for _, d in present),
        max_latency=max(d.latency for _, d in present),
        sync=() if size == 1 else tuple((d.bandwidth, d.latency) for _, d in present),
        limit=min(limits, default=INF),
    )


def _int_prefix_table(values: Sequence[int]) -> list[list[int]]:
    return [list(itertools.accumulate(values[s:])) for s in range(len(values))]


class CostModel:
    """The cost model of one problem, with devices grouped into types and cached group statistics."""

    def __init__(self, p: HybridProblem) -> None:
        self.p = p
        self.num_layers = p.num_layers
        self.times = prefix_table(p.layer_times)
        self.params = _int_prefix_table(p.param_bytes or (0,) * p.num_layers)
        self.acts = _int_prefix_table(p.output_bytes)
        # Type 0 is the central node alone; workers of equal parameters share a type, numbered by
        # their lowest device index.
        self.reps: list[Device] = [p.devices[0]]
        self.members: list[list[int]] = [[0]]
        self.type_of = [0]
        index: dict[Device, int] = {}
        for d, device in enumerate(p.devices[1:], start=1):
            t = index.setdefault(device, len(self.reps))
            if t == len(self.reps):
                self.reps.append(device)
                self.members.append([])
            self.members[t].append(d)
            self.type_of.append(t)
        self.counts: Counts = tuple(len(m) for m in self.members)
        self.central: Counts = (1,) + (0,) * (len(self.counts) - 1)
        self.limited = any(d.memory_limit is not None for d in p.devices)
        self._stats: dict[Counts, GroupStats] = {}
        self._links: dict[tuple[Counts, Counts, int], float] = {}

    def stats(self, counts: Counts) -> GroupStats:
        found = self._stats.get(counts)
        if found is None:
            found = self._stats[counts] = _make_stats(self.reps, counts)
        return found

    def counts_of(self, group: Sequence[int]) -> Counts:
        counts = [0] * len(self.counts)
        for d in group:
            counts[self.type_of[d]] += 1
        return tuple(counts)

    def stage_time(self, st: GroupStats, s: int, e: int) -> float:
        """Compute ``T(s, e) * C_G`` plus, for replicas, the gradient exchange."""
        t = self.times[s][e - s - 1] * st.capacity
        if st.size > 1:
            total = st.size * self.params[s][e - s - 1]
            t += max(total / bandwidth + latency for bandwidth, latency in st.sync)
        return t

    def first_groups(self) -> list[Counts]:
        """The groups stage 0 may have: the central node alone, or with helpers (``replicate_first``)."""
        if not self.p.replicate_first:
            return [self.central]
        cap = self.p.max_replicas
        ranges = [range(1, 2)] + [range(c + 1) for c in self.counts[1:]]
        return [
            g for g in itertools.product(*ranges) if (cap is None or sum(g) <= cap) and self.shares_allowed(g)
        ]

    def first_end(self, counts: Counts) -> int:
        """The last layer stage 0 may end at: a replicated stage 0 is never the only stage (the central
        node computes the whole batch's loss there)."""
        return self.p.num_layers - (1 if sum(counts) > 1 else 0)

    def feed(self, counts: Counts) -> float:
        """Stage 0's input rows sent by the central node to its helpers (0 for the central node alone)."""
        st = self.stats(counts)
        if st.size == 1:
            return 0.0
        size = self.p.input_bytes
        central = self.reps[0]
        sent = max(x * size / self.reps[t].bandwidth for t, x in enumerate(st.share_of) if t and x)
        latency = max(self.reps[t].latency for t, c in enumerate(counts) if t and c)
        return max((1.0 - st.share_of[0]) * size / central.bandwidth, sent) + latency

    def fits(self, st: GroupStats, s: int, e: int, f: int) -> bool:
        """Whether the stage's memory with ``f`` batches in flight is within every member's limit."""
        if st.limit == INF:
            return True
        return memory_bytes(f, self.params[s][e - s - 1], self.acts[s][e - s - 1]) <= st.limit

    def link(self, before: Counts, after: Counts, s: int) -> float:
        """The link term (forward + backward) between groups ``before`` and ``after`` at cut ``s``."""
        key = (before, after, s)
        found = self._links.get(key)
        if found is None:
            a, b = self.stats(before), self.stats(after)
            size = self.p.output_bytes[s - 1] * self.p.activation_factor
            latency = max(a.max_latency, b.max_latency)
            forward = max(max(x * size / bw for x, bw in a.senders), size / b.min_bandwidth) + latency
            backward = max(max(x * size / bw for x, bw in b.senders), size / a.min_bandwidth) + latency
            found = self._links[key] = forward + backward
        return found

    def shares_allowed(self, counts: Counts) -> bool:
        """Whether every member of a group of these types gets at least ``min_share`` of the rows."""
        st = self.stats(counts)
        return st.size == 1 or min(st.share_of[t] for t, c in enumerate(counts) if c) >= self.p.min_share

    def predict(self, points: Sequence[int], groups: Groups) -> float:
        counts = [self.counts_of(g) for g in groups]
        worst = max(self.stage_time(self.stats(c), points[k], points[k + 1]) for k, c in enumerate(counts))
        worst = max(worst, self.feed(counts[0]))
        for k in range(1, len(groups)):
            worst = max(worst, self.link(counts[k - 1], counts[k], points[k]))
        return worst

    def plan_fits(self, points: Sequence[int], groups: Groups) -> bool:
        bound = self.p.bound(len(groups))
        return all(
            self.fits(self.stats(self.counts_of(g)), points[k], points[k + 1], max(1, bound - k))
            for k, g in enumerate(groups)
        )

    def shares(self, groups: Groups) -> tuple[tuple[float, ...], ...]:
        result = []
        for group in groups:
            st = self.stats(self.counts_of(group))
            result.append(tuple(st.share_of[self.type_of[d]] for d in group))
        return tuple(result)

    def infeasible(self) -> ValueError:
        p = self.p
        limits = [d.memory_limit for d in p.devices]
        total_params = sum(p.param_bytes) if p.param_bytes is not None else 0
        return ValueError(
            f"no hybrid plan of {p.num_layers} layers on {p.num_devices} devices fits the memory limits "
            f"{limits} (bytes; total parameter bytes {total_params}, total activation bytes "
            f"{sum(p.output_bytes)}, in_flight {p.in_flight}): raise the memory limits, add devices, "
            "lower in_flight or split the model into smaller layers"
        )


# --------------------------------------------------------------------------------------------------
# Validation and the public cost functions


def _check_groups(p: HybridProblem, groups: Sequence[Sequence[int]]) -> Groups:
    result = tuple(tuple(g) for g in groups)
    if not result or result[0][:1] != (0,) or (not p.replicate_first and result[0] != (0,)):
        first = result[0] if result else None
        alone = "first" if p.replicate_first else "alone"
        raise ValueError(f"stage 0 must be the central node (device 0) {alone}, got groups[0] = {first}")
    seen: set[int] = set()
    for k, group in enumerate(result):
        if not group:
            raise ValueError(f"stage {k} has no device: every stage needs at least one")
        if any(b <= a for a, b in itertools.pairwise(group)):
            raise ValueError(f"groups[{k}] = {group} must be ascending without repeats")
        if p.max_replicas is not None and len(group) > p.max_replicas:
            raise ValueError(f"stage {k} has {len(group)} devices, more than max_replicas {p.max_replicas}")
        for d in group:
            if not 0 <= d < p.num_devices:
                raise ValueError(f"device {d} in stage {k} is outside 0..{p.num_devices - 1}")
            if d in seen:
                raise ValueError(f"device {d} holds more than one stage (again in stage {k})")
            seen.add(d)
    return result


def _check_plan(p: HybridProblem, points: Sequence[int], groups: Sequence[Sequence[int]]) -> Groups:
    checked = _check_groups(p, groups)
    check_points(points, p.num_layers)
    if len(points) != len(checked) + 1:
        raise ValueError(
            f"partition points {list(points)} give {len(points) - 1} stages, {len(checked)} groups"
        )
    if len(checked) == 1 and len(checked[0]) > 1:
        raise ValueError(
            f"stage 0 has helpers {checked[0][1:]} but is the only stage: it needs a stage after it"
        )
    return checked


def plan_shares(p: HybridProblem, groups: Sequence[Sequence[int]]) -> tuple[tuple[float, ...], ...]:
    """Each member's fraction of every batch's rows, per stage in the order of ``groups``:
    ``C_G / C_d``, proportional to ``1 / C_d`` and summing to 1 (exactly 1.0 for a single device)."""
    return CostModel(p).shares(_check_groups(p, groups))


def predict_hybrid(
    p: HybridProblem,
    points: Sequence[int],
    groups: Sequence[Sequence[int]],
    shares: Sequence[Sequence[float]] | None = None,
) -> float:
    """The plan's seconds per batch: the largest stage time (compute + gradient exchange) and link term.

    ``shares``: each member's fraction of the rows, per stage in the order of ``groups``, when they are
    not in proportion to the members' speeds (:func:`plan_shares`, the default): a plan running with the
    shares of older measurements. A replicated stage then computes at the pace of the member slowest for
    its share (``max share_d * C_d`` in place of ``C_G``); the input feed is counted as proportional."""
    model = CostModel(p)
    checked = _check_plan(p, points, groups)
    worst = model.predict(points, checked)
    if shares is None:
        return worst
    if len(shares) != len(checked) or any(len(x) != len(g) for x, g in zip(shares, checked, strict=True)):
        raise ValueError(f"shares {shares} do not match the groups {checked}")
    for k, (group, share) in enumerate(zip(checked, shares, strict=True)):
        if len(group) > 1:
            s, e = points[k], points[k + 1]
            st = model.stats(model.counts_of(group))
            pace = max(x * p.devices[d].capacity for d, x in zip(group, share, strict=True))
            worst = max(worst, model.stage_time(st, s, e) + model.times[s][e - s - 1] * (pace - st.capacity))
    return worst


def fits_hybrid(p: HybridProblem, points: Sequence[int], groups: Sequence[Sequence[int]]) -> bool:
    """Whether every member of every stage has the stage's memory within its ``memory_limit`` (``<=``)."""
    return CostModel(p).plan_fits(points, _check_plan(p, points, groups))


def capacity_bound(p: HybridProblem) -> float:
    """A lower bound on every plan's seconds per batch: the whole model's work spread over every device
    in proportion to its speed, with free links and no gradient exchange (``sum(layer_times) /
    sum(1 / C_d)``). How far the best plan with one device per stage is from it bounds what replicated
    stages (stage 0's included) can gain."""
    return sum(p.layer_times) / sum(1.0 / d.capacity for d in p.devices)


def tie_threshold(optimum: float) -> float:
    return optimum + abs(optimum) * TIE_TOLERANCE


def tie_key(points: Sequence[int], groups: Groups) -> TieKey:
    return (sum(len(g) for g in groups), len(groups), tuple(-x for x in reversed(points)), groups)


def plan_from_key(model: CostModel, key: TieKey) -> HybridPlan:
    points = tuple(-x for x in reversed(key[2]))
    groups = key[3]
    return HybridPlan(points, groups, model.shares(groups), model.predict(points, groups))


# --------------------------------------------------------------------------------------------------
# Brute force (tests)


def _assignments(
    num_devices: int, num_stages: int, max_replicas: int | None, first: bool = False
) -> Iterator[Groups]:
    """Every way to give stages ``1 .. num_stages - 1`` disjoint non-empty sets of workers (and, with
    ``first``, stage 0 helpers besides the central node)."""
    labels_of = range(num_stages + 1) if first else range(num_stages)  # 0 = unused, num_stages = stage 0
    for labels in itertools.product(labels_of, repeat=num_devices - 1):
        helpers = tuple(d for d, label in enumerate(labels, start=1) if label == num_stages)
        groups = (
            (0, *helpers),
            *(
                tuple(d for d, label in enumerate(labels, start=1) if label == k)
                for k in range(1, num_stages)
            ),
        )
        if first and num_stages == 1 and helpers:
            continue  # a replicated stage 0 is never the only stage
        if all(groups) and (max_replicas is None or all(len(g) <= max_replicas for g in groups)):
            yield groups


def all_plans(p: HybridProblem) -> Iterator[tuple[tuple[int, ...], Groups]]:
    """Every ``(points, groups)`` the planner may choose among, memory aside (exponential)."""
    for n in range(1, min(p.num_layers, p.num_devices) + 1):
        assignments = list(_assignments(p.num_devices, n, p.max_replicas, p.replicate_first))
        for cuts in itertools.combinations(range(1, p.num_layers), n - 1):
            points = (0, *cuts, p.num_layers)
            for groups in assignments:
                yield points, groups


def brute_force_hybrid(p: HybridProblem) -> HybridPlan:
    """Every plan of :func:`all_plans` that fits memory, minimising :func:`predict_hybrid` with
    :func:`solve_hybrid`'s tolerance and tie rule. Exponential: for tests."""
    model = CostModel(p)
    scored = [
        (model.predict(points, groups), points, groups)
        for points, groups in all_plans(p)
        if model.plan_fits(points, groups) and all(model.shares_allowed(model.counts_of(g)) for g in groups)
    ]
    if not scored:
        raise model.infeasible()
    threshold = tie_threshold(min(t for t, _, _ in scored))
    return plan_from_key(
        model, min(tie_key(points, groups) for t, points, groups in scored if t <= threshold)
    )
