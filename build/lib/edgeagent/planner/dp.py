"""The partition DP of papers/000 Sec. III-D (eq. 4-7), with per-link bandwidths and memory limits.

Conventions (as in :mod:`edgeagent.planner.partition`): ``points`` has ``n + 1`` entries and stage ``k``
owns layers ``[points[k], points[k+1])``; stage 0 is the central node. ``links[k]`` joins stage ``k`` and
``k + 1``; the tensor crossing it is the output of the cut layer ``points[k+1] - 1``.

The paper's recursion (eq. 4-5, with ``l`` the last layer of the sub-pipeline, inclusive)::

    A(j, 1) = T^0(0, j)
    A(j, n) = min_l max( A(l, n-1),  2 * T_c^{n-2}_l,  T^{n-1}(l+1, j) )
    T_c^i_j = D_j / B_{i,i+1}                   (eq. 6)
    T^i(l+1, j) = sum_{m=l+1}^{j} T^0_{e,m} * C_i   (eq. 3, 7)

is implemented over half-open ranges: ``A[k][e]`` is the best bottleneck time of layers ``[0, e)`` on
stages ``0..k-1``. Every link has its own bandwidth (``links[k - 2]`` for the link in front of stage
``k - 1``); nothing is shared between links. Beyond the paper: a per-message ``latency`` per link, an
``activation_factor`` on ``D_j`` (compression), and per-stage memory limits.

AccEPT (papers/004 eq. 9-10) keeps the recursion and replaces eq. 3's ``T^0 * C_k`` with the latency
predictor's time of the whole range on the device: ``range_times[k][s][e - s - 1]`` (a table per
stage; ``None`` for a stage keeps eq. 3, e.g. the central node's own profile in eq. 9).

Several splits often share the optimal bottleneck; ``Problem.tie_break`` picks one (see :func:`solve`).
``"latest"`` is this DP's fixed rule, the baseline: the latest cuts, so the last stage gets as few layers as
the optimum allows and the earliest stages fill up to the bottleneck, whatever their speed. ``"slack"`` is a
second objective for noisy times (the predictor's): among the splits whose every stage and link is within
``T* * (1 + tie_tolerance)``, the least sum of stage compute times, so that a slow device, wherever it is,
gets as few layers as that bound allows instead of as many as fit under it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from edgeagent.planner.capacity import range_sum
from edgeagent.planner.partition import check_points, stage_of_layer

_INF = math.inf

TieBreak = Literal["latest", "slack"]
TIE_BREAKS: tuple[TieBreak, ...] = ("latest", "slack")


@dataclass(frozen=True)
class Link:
    """The real path between two consecutive stages (through the broker)."""

    bandwidth: float  # bytes/s; math.inf = free
    latency: float = 0.0  # seconds per message; 0 = the paper's model

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:  # also rejects NaN
            raise ValueError(f"link bandwidth {self.bandwidth} bytes/s must be > 0")
        if not (math.isfinite(self.latency) and self.latency >= 0):
            raise ValueError(f"link latency {self.latency} s must be finite and >= 0")


def _finite_nonneg(name: str, values: Sequence[float]) -> None:
    for i, v in enumerate(values):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name}[{i}] = {v} must be finite and >= 0")


def _finite_positive(name: str, values: Sequence[float]) -> None:
    for i, v in enumerate(values):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name}[{i}] = {v} must be finite and > 0")


@dataclass(frozen=True)
class Problem:
    """Everything the DP needs; all sequences are stored as tuples (lists are converted)."""

    layer_times: tuple[float, ...]  # T^0_{e,j}: forward+backward seconds per batch on the central node
    output_bytes: tuple[int, ...]  # D_j
    capacities: tuple[float, ...]  # C_k per stage in pipeline order (C_0: the central node)
    links: tuple[Link, ...]  # len n - 1; links[k] joins stage k and k + 1
    param_bytes: tuple[int, ...] | None = None  # per layer: memory limits and move cost
    memory_limits: tuple[float | None, ...] | None = None  # per stage, bytes; None = unlimited
    in_flight: int = 0  # batches in flight on stage 0; 0 = the number of stages (PipeDream's NOAM)
    activation_factor: float = 1.0  # multiplies D_j on the wire (compressed size / raw size)
    # Per stage: predicted seconds of every range [s, e) as table[s][e - s - 1] (AccEPT eq. 10), or None.
    range_times: tuple[tuple[tuple[float, ...], ...] | None, ...] | None = None
    # Which of the splits with the optimal bottleneck T* (see solve): "latest", the latest cuts (the
    # baseline), or "slack", the least sum of stage times among splits within T* * (1 + tie_tolerance).
    tie_break: TieBreak = "latest"
    tie_tolerance: float = 0.0  # "slack" only: a share of T* (so the bottleneck may exceed T* by it)

    def __post_init__(self) -> None:
        for name in ("layer_times", "output_bytes", "capacities", "links", "param_bytes", "memory_limits"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        self._check_sizes()
        _finite_nonneg("layer_times", self.layer_times)
        _finite_nonneg("output_bytes", self.output_bytes)
        _finite_positive("capacities", self.capacities)
        self._check_param_bytes()
        self._check_memory_limits()
        self._check_options()
        self._check_range_times()

    def _check_range_times(self) -> None:
        if self.range_times is None:
            return
        tables = tuple(None if tb is None else tuple(tuple(row) for row in tb) for tb in self.range_times)
        object.__setattr__(self, "range_times", tables)
        if len(tables) != len(self.capacities):
            raise ValueError(f"{len(tables)} range-time tables for {len(self.capacities)} stages")
        num_layers = len(self.layer_times)
        for k, table in enumerate(tables):
            if table is None:
                continue
            if [len(row) for row in table] != [num_layers - s for s in range(num_layers)]:
                raise ValueError(f"range_times[{k}] is not a table of the {num_layers} layers' ranges")
            for row in table:
                _finite_nonneg(f"range_times[{k}]", row)

    def _check_sizes(self) -> None:
        """Layers, stages, output sizes and links that fit together."""
        num_layers, n = len(self.layer_times), len(self.capacities)
        if num_layers < 1:
            raise ValueError("a problem needs at least 1 layer, got 0")
        if not 1 <= n <= num_layers:
            raise ValueError(f"cannot split {num_layers} layers into {n} stages (need 1..{num_layers})")
        if len(self.output_bytes) != num_layers:
            raise ValueError(f"{len(self.output_bytes)} output sizes for {num_layers} layers")
        if len(self.links) != n - 1:
            raise ValueError(f"{len(self.links)} links for {n} stages (need {n - 1})")
        if not all(isinstance(link, Link) for link in self.links):
            raise ValueError("links must be Link instances")

    def _check_param_bytes(self) -> None:
        if self.param_bytes is None:
            return
        if len(self.param_bytes) != len(self.layer_times):
            raise ValueError(f"{len(self.param_bytes)} parameter sizes for {len(self.layer_times)} layers")
        _finite_nonneg("param_bytes", self.param_bytes)

    def _check_memory_limits(self) -> None:
        if self.memory_limits is None:
            return
        if len(self.memory_limits) != len(self.capacities):
            raise ValueError(f"{len(self.memory_limits)} memory limits for {len(self.capacities)} stages")
        for k, m in enumerate(self.memory_limits):
            if m is not None and not m >= 0:
                raise ValueError(f"memory_limits[{k}] = {m} must be >= 0 or None")

    def _check_options(self) -> None:
        if self.in_flight < 0:
            raise ValueError(f"in_flight {self.in_flight} must be >= 0 (0 = number of stages)")
        if not (math.isfinite(self.activation_factor) and self.activation_factor >= 0):
            raise ValueError(f"activation_factor {self.activation_factor} must be finite and >= 0")
        if self.tie_break not in TIE_BREAKS:
            allowed = ", ".join(repr(t) for t in TIE_BREAKS)
            raise ValueError(f"tie_break {self.tie_break!r} must be one of {allowed}")
        if not (math.isfinite(self.tie_tolerance) and self.tie_tolerance >= 0):
            raise ValueError(f"tie_tolerance {self.tie_tolerance} must be finite and >= 0")

    @property
    def num_stages(self) -> int:
        return len(self.capacities)

    @property
    def num_layers(self) -> int:
        return len(self.layer_times)

    @property
    def bound(self) -> int:
        """Batches in flight on stage 0 (``in_flight``, or the number of stages when it is 0)."""
        return self.in_flight or self.num_stages

    def limit(self, k: int) -> float | None:
        return None if self.memory_limits is None else self.memory_limits[k]


def problem_for_uniform(
    layer_times: Sequence[float],
    output_bytes: Sequence[int],
    num_stages: int,
    *,
    bandwidth: float = math.inf,
    latency: float = 0.0,
    param_bytes: Sequence[int] | None = None,
) -> Problem:
    """A problem with equal devices (every ``C_k = 1``) and one kind of link everywhere: the paper's
    fallback when no execution times have been collected yet (Sec. III-F)."""
    return Problem(
        layer_times=tuple(layer_times),
        output_bytes=tuple(output_bytes),
        capacities=(1.0,) * num_stages,
        links=tuple(Link(bandwidth, latency) for _ in range(num_stages - 1)),
        param_bytes=None if param_bytes is None else tuple(param_bytes),
    )


def _check_stage(p: Problem, k: int) -> None:
    if not 0 <= k < p.num_stages:
        raise ValueError(f"stage {k} is outside 0..{p.num_stages - 1}")


def _check_range(p: Problem, start: int, end: int) -> None:
    if not 0 <= start < end <= p.num_layers:
        raise ValueError(f"layer range [{start}, {end}) is empty or outside 0..{p.num_layers}")


def _table(p: Problem, k: int) -> tuple[tuple[float, ...], ...] | None:
    return None if p.range_times is None else p.range_times[k]


def compute_time(p: Problem, k: int, start: int, end: int) -> float:
    """Eq. 3 and 7: ``T^k(start..end-1) = sum_{m=start}^{end-1} T^0_{e,m} * C_k`` seconds per batch; with a
    predictor's table for stage ``k`` (AccEPT eq. 10), the table's time of the range."""
    _check_stage(p, k)
    _check_range(p, start, end)
    table = _table(p, k)
    if table is not None:
        return table[start][end - start - 1]
    return range_sum(p.layer_times, start, end) * p.capacities[k]


def comm_time(p: Problem, k: int, layer: int) -> float:
    """Eq. 6 with eq. 5's factor 2: ``2 * (latency_k + D_layer * activation_factor / B_k)`` on link ``k``.

    Two crossings of link ``k`` per batch: the activations of ``layer`` forward and their gradients
    back. ``layer`` is the last layer of stage ``k``. With ``latency = 0`` and ``activation_factor = 1``
    this is the paper's ``2 * T_{c,layer}^k``.
    """
    if not 0 <= k < len(p.links):
        raise ValueError(f"link {k} is outside 0..{len(p.links) - 1}")
    if not 0 <= layer < p.num_layers:
        raise ValueError(f"layer {layer} is outside 0..{p.num_layers - 1}")
    link = p.links[k]
    return 2.0 * (link.latency + p.output_bytes[layer] * p.activation_factor / link.bandwidth)


def in_flight_at(p: Problem, k: int) -> int:
    """Batches between forward and backward on stage ``k`` under 1F1B: ``max(1, bound - k)``."""
    return max(1, p.bound - k)


def _plain_sum(values: Sequence[int]) -> int:
    """Left-to-right sum, the order ``itertools.accumulate`` uses in :func:`solve`."""
    total = 0
    for v in values:
        total += v
    return total


def _left_sum(values: Sequence[float]) -> float:
    """Left-to-right float sum (not ``sum``, which compensates rounding from Python 3.12 on): the order
    in which :func:`solve`'s ``"slack"`` DP adds stage times, so that both agree bit for bit."""
    total = 0.0
    for v in values:
        total += v
    return total


def _memory(p: Problem, k: int, params: int, activations: int) -> float:
    return memory_bytes(in_flight_at(p, k), params, activations)


def memory_bytes(outstanding: int, params: int, activations: int) -> float:
    """A stage's memory with ``outstanding`` batches in flight on it: ``P * (f + 1 + 2) + f * A`` (its
    weights, a stashed version per batch in flight, gradients and momentum; the batches' activations)."""
    return float(params * (outstanding + 1 + 2) + outstanding * activations)


def stage_memory(p: Problem, k: int, start: int, end: int) -> float:
    """Upper bound on the training memory (bytes) of stage ``k`` owning ``[start, end)``.

    With ``f = max(1, bound - k)`` batches in flight on stage ``k`` (``bound = in_flight`` or, when 0,
    the number of stages; earlier stages have more batches in flight, as in PipeDream)::

        memory = P * (f + 1 + 2) + f * A

    * ``P``: the stage's parameter bytes (0 without ``param_bytes``). It keeps one stashed weight
      version per batch in flight plus the live weights, ``f + 1`` copies (``n - k + 1`` with the
      default bound, the most the stash ever holds), plus 2 for the gradient and the momentum buffer.
    * ``A = sum D_j`` over its layers: every batch in flight keeps its layers' outputs for the
      backward pass (raw sizes: ``activation_factor`` compresses the wire, not memory).

    Inputs received, optimizer state other than momentum, and framework overhead are not counted.
    """
    _check_stage(p, k)
    _check_range(p, start, end)
    params = 0 if p.param_bytes is None else _plain_sum(p.param_bytes[start:end])
    return _memory(p, k, params, _plain_sum(p.output_bytes[start:end]))


def _check_split(p: Problem, points: Sequence[int]) -> None:
    check_points(points, p.num_layers)
    if len(points) != p.num_stages + 1:
        raise ValueError(
            f"partition points {list(points)} give {len(points) - 1} stages, need {p.num_stages}"
        )


def fits(p: Problem, points: Sequence[int]) -> bool:
    """Whether every stage's :func:`stage_memory` is within its memory limit (``<=``)."""
    _check_split(p, points)
    for k in range(p.num_stages):
        limit = p.limit(k)
        if limit is not None and stage_memory(p, k, points[k], points[k + 1]) > limit:
            return False
    return True


def predict(p: Problem, points: Sequence[int]) -> float:
    """The pipeline's seconds per batch for a split: the max of eq. 5 unrolled, i.e. the largest of every
    stage's :func:`compute_time` and every link's :func:`comm_time` at its cut layer."""
    _check_split(p, points)
    worst = max(compute_time(p, k, points[k], points[k + 1]) for k in range(p.num_stages))
    for k in range(p.num_stages - 1):
        worst = max(worst, comm_time(p, k, points[k + 1] - 1))
    return worst


def compute_sum(p: Problem, points: Sequence[int]) -> float:
    """The sum of every stage's :func:`compute_time` (added from stage 0 on): the compute one batch goes
    through on its way down the pipeline and back, the quantity ``tie_break="slack"`` minimises."""
    _check_split(p, points)
    return _left_sum([compute_time(p, k, points[k], points[k + 1]) for k in range(p.num_stages)])


def _infeasible(p: Problem) -> ValueError:
    total_params = 0 if p.param_bytes is None else sum(p.param_bytes)
    limits = list(p.memory_limits) if p.memory_limits is not None else None
    return ValueError(
        f"no split of {p.num_layers} layers into {p.num_stages} stages fits the memory limits {limits} "
        f"(bytes; total parameter bytes {total_params}, total activation bytes {sum(p.output_bytes)}, "
        f"bound {p.bound} batches in flight)"
    )


def prefix_table(values: Sequence[float]) -> list[list[float]]:
    """``table[s][e - s - 1] == range_sum(values, s, e)`` bit for bit (same order of additions)."""
    table = []
    for s in range(len(values)):
        row, acc = [], 0.0
        for m in range(s, len(values)):
            acc += values[m]
            row.append(acc)
        table.append(row)
    return table


class _Stages:
    """What :func:`solve`'s DPs look up ``O(n L^2)`` times, tabulated once: a stage's compute time over a
    range (:func:`compute_time`, bit for bit), whether it fits its memory limit, a link's time."""

    def __init__(self, p: Problem) -> None:
        num_layers = p.num_layers
        sizes = p.param_bytes if p.param_bytes is not None else (0,) * num_layers
        self.p = p
        self.times = prefix_table(p.layer_times)
        self.params = [list(itertools.accumulate(sizes[s:])) for s in range(num_layers)]
        self.acts = [list(itertools.accumulate(p.output_bytes[s:])) for s in range(num_layers)]
        self.tables = [_table(p, k) for k in range(p.num_stages)]

    def cost(self, k: int, s: int, e: int) -> float:
        table = self.tables[k]
        if table is not None:
            return table[s][e - s - 1]
        return self.times[s][e - s - 1] * self.p.capacities[k]

    def ok(self, k: int, s: int, e: int) -> bool:
        limit = self.p.limit(k)
        if limit is None:
            return True
        return _memory(self.p, k, self.params[s][e - s - 1], self.acts[s][e - s - 1]) <= limit

    def comm(self, link: int, layer: int) -> float:
        return comm_time(self.p, link, layer)


def solve(p: Problem) -> list[int]:
    """The optimal split by the DP of eq. 4-5, in ``O(n L^2)`` time.

    ``A[1][e] = T^0(0..e-1)`` (eq. 4, scaled by ``C_0``) and
    ``A[k][e] = min_{k-1 <= s < e} max(A[k-1][s], comm_time(k-2, s-1), compute_time(k-1, s, e))``
    (eq. 5): the first ``k - 1`` stages take ``[0, s)``, stage ``k - 1`` takes ``[s, e)`` and link
    ``k - 2`` carries the output of layer ``s - 1``. Every stage gets at least one layer; a stage whose
    :func:`stage_memory` exceeds its limit is infeasible (skipped). Raises ``ValueError`` if no split fits.

    Tie-breaking (deterministic, identical to :func:`brute_force`), by ``p.tie_break``:

    * ``"latest"`` (the default, the baseline): among all optimal splits, the one whose points read from
      the last to the first are lexicographically largest, i.e. the latest last cut, then the latest cut
      before it, and so on. The last stage thus gets as few layers as the optimum allows and the extra
      layers go to the earlier stages (``[0, 2, 3]`` for three equal layers on two equal devices, as
      :func:`balanced_partition` gives), which fill up to the bottleneck whatever their speed: with noisy
      times, a slow device before the last stage (e.g. a slow central node) gets as many layers as fit
      under the bottleneck, and a slow last stage keeps a layer that a bottleneck a hair above ``T*``
      would have moved to a fast device; the real pipeline then waits on the slow device.
    * ``"slack"``: with ``T*`` the optimal bottleneck and ``cap = T* * (1 + p.tie_tolerance)``, among the
      splits that fit and whose every stage's compute time and every link's time is ``<= cap``, the one
      with the least :func:`compute_sum` (ties: the ``"latest"`` rule). A slow device gets as few layers
      as the cap allows and the others keep slack, so an error in a predicted time costs less. With
      ``tie_tolerance > 0`` the chosen split's :func:`predict` may be up to ``cap``, above ``T*``: the
      tolerance trades bottleneck for sum. A second ``O(n L^2)`` DP, see :func:`_least_sum`.
    """
    stages = _Stages(p)
    best = _bottlenecks(p, stages)
    optimum = best[p.num_stages][p.num_layers]
    if optimum == _INF:
        raise _infeasible(p)
    if p.tie_break == "slack":
        return _least_sum(p, stages, optimum * (1.0 + p.tie_tolerance))
    return _latest_cuts(p, stages, best, optimum)


def _bottlenecks(p: Problem, stages: _Stages) -> list[list[float]]:
    """Eq. 4-5: ``A[k][e]``, the best bottleneck of layers ``[0, e)`` on stages ``0..k-1`` (inf: none)."""
    n, num_layers = p.num_stages, p.num_layers
    cost, ok, comm = stages.cost, stages.ok, stages.comm
    best = [[_INF] * (num_layers + 1) for _ in range(n + 1)]
    for e in range(1, num_layers + 1):
        if ok(0, 0, e):
            best[1][e] = cost(0, 0, e)
    for k in range(2, n + 1):
        for e in range(k, num_layers + 1):
            value = _INF
            for s in range(k - 1, e):
                prefix = best[k - 1][s]
                if prefix == _INF or not ok(k - 1, s, e):
                    continue
                value = min(value, max(prefix, comm(k - 2, s - 1), cost(k - 1, s, e)))
            best[k][e] = value
    return best


def _latest_cuts(p: Problem, stages: _Stages, best: list[list[float]], optimum: float) -> list[int]:
    """The ``"latest"`` rule by backtracking: from the end, take the latest cut ``s`` whose last stage and
    link are within the optimum and whose prefix ``A[k-1][s]`` is within it too."""
    cost, ok, comm = stages.cost, stages.ok, stages.comm
    points = [p.num_layers]
    e = p.num_layers
    for k in range(p.num_stages, 1, -1):
        for s in range(e - 1, k - 2, -1):
            if (
                best[k - 1][s] <= optimum
                and ok(k - 1, s, e)
                and max(comm(k - 2, s - 1), cost(k - 1, s, e)) <= optimum
            ):
                break
        else:  # pragma: no cover - the optimum guarantees a cut
            raise AssertionError(f"backtracking found no cut for stage {k - 1} below layer {e}")
        points.append(s)
        e = s
    points.append(0)
    points.reverse()
    return points


def _least_sum(p: Problem, stages: _Stages, cap: float) -> list[int]:
    """The ``"slack"`` rule: the least :func:`compute_sum` over the splits whose stages fit and whose stage
    and link times are all ``<= cap``; ties by the ``"latest"`` rule.

    ``S[1][e] = cost(0, 0, e)`` and ``S[k][e] = min_s S[k-1][s] + cost(k-1, s, e)`` over the cuts ``s``
    whose stage ``k - 1`` and link ``k - 2`` are within ``cap`` (min-sum under a per-stage cap). Float
    addition is monotone, so ``S`` is the least left-to-right sum exactly as :func:`compute_sum` adds it.
    Backtracking from the end takes the latest cut ``s`` such that the least prefix ``S[k-1][s]`` plus
    this stage plus the stages already chosen still adds up to ``<= S[n][L]``: a prefix with a larger sum
    can round to the same total, and this test (not ``S[k-1][s] == ...``) admits it as brute force does.
    """
    n, num_layers = p.num_stages, p.num_layers
    cost, ok, comm = stages.cost, stages.ok, stages.comm

    def within(k: int, s: int, e: int) -> bool:
        """Stage ``k`` may own ``[s, e)``: it fits, and it and the link in front of it are within the cap."""
        return ok(k, s, e) and cost(k, s, e) <= cap and (k == 0 or comm(k - 1, s - 1) <= cap)

    least = [[_INF] * (num_layers + 1) for _ in range(n + 1)]
    for e in range(1, num_layers + 1):
        if within(0, 0, e):
            least[1][e] = cost(0, 0, e)
    for k in range(2, n + 1):
        for e in range(k, num_layers + 1):
            value = _INF
            for s in range(k - 1, e):
                prefix = least[k - 1][s]
                if prefix == _INF or not within(k - 1, s, e):
                    continue
                value = min(value, prefix + cost(k - 1, s, e))
            least[k][e] = value
    total = least[n][num_layers]
    if total == _INF:  # pragma: no cover - the split with the optimal bottleneck is within the cap
        raise AssertionError(f"no split within the cap {cap}")

    points = [num_layers]
    suffix: list[float] = []  # the chosen stages' times, stage k onwards
    e = num_layers
    for k in range(n, 1, -1):
        for s in range(e - 1, k - 2, -1):
            prefix = least[k - 1][s]
            if (
                prefix != _INF
                and within(k - 1, s, e)
                and _left_sum([prefix, cost(k - 1, s, e), *suffix]) <= total
            ):
                break
        else:  # pragma: no cover - the least sum guarantees a cut
            raise AssertionError(f"backtracking found no cut for stage {k - 1} below layer {e}")
        suffix.insert(0, cost(k - 1, s, e))
        points.append(s)
        e = s
    points.append(0)
    points.reverse()
    return points


def brute_force(p: Problem) -> list[int]:
    """Every split, with :func:`solve`'s objective and tie rule. Exponential: for tests.

    ``"latest"``: the least :func:`predict` among the splits that :func:`fits`; ``"slack"``: the least
    :func:`compute_sum` among those whose :func:`predict` is within ``(1 + tie_tolerance)`` times that
    least. Ties in both: the latest cuts, compared from the last one.
    """
    feasible = [
        points
        for cuts in itertools.combinations(range(1, p.num_layers), p.num_stages - 1)
        if fits(p, points := [0, *cuts, p.num_layers])
    ]
    if not feasible:
        raise _infeasible(p)
    scored = [(predict(p, points), points) for points in feasible]
    if p.tie_break == "slack":
        cap = min(value for value, _ in scored) * (1.0 + p.tie_tolerance)
        scored = [(compute_sum(p, points), points) for value, points in scored if value <= cap]
    best = scored[0]
    for value, points in scored[1:]:
        if value < best[0] or (value == best[0] and points[::-1] > best[1][::-1]):
            best = (value, points)
    return best[1]


def moved_bytes(old_points: Sequence[int], new_points: Sequence[int], param_bytes: Sequence[int]) -> int:
    """Parameter bytes of the layers whose owner stage index differs between the two splits."""
    check_points(old_points, len(param_bytes))
    check_points(new_points, len(param_bytes))
    return sum(
        size
        for j, size in enumerate(param_bytes)
        if stage_of_layer(old_points, j) != stage_of_layer(new_points, j)
    )


def repartition_gain(
    p: Problem,
    old_points: Sequence[int],
    new_points: Sequence[int],
    *,
    horizon_batches: int,
    move_bandwidth: float,
    overhead: float = 0.0,
) -> tuple[bool, float, float]:
    """Whether moving from ``old_points`` to ``new_points`` pays off within ``horizon_batches`` batches.

    ``gain = (predict(old) - predict(new)) * horizon_batches`` seconds;
    ``cost = moved_bytes * 2 / move_bandwidth + overhead`` seconds (weights and momentum both move).
    Returns ``(gain > cost and new != old, gain, cost)``. Needs ``p.param_bytes``.
    """
    if p.param_bytes is None:
        raise ValueError(
            f"repartition_gain needs param_bytes for the {p.num_layers} layers to price the move"
        )
    if horizon_batches < 0:
        raise ValueError(f"horizon_batches {horizon_batches} must be >= 0")
    if not move_bandwidth > 0:
        raise ValueError(f"move_bandwidth {move_bandwidth} bytes/s must be > 0")
    if not (math.isfinite(overhead) and overhead >= 0):
        raise ValueError(f"overhead {overhead} s must be finite and >= 0")
    gain = (predict(p, old_points) - predict(p, new_points)) * horizon_batches
    cost = moved_bytes(old_points, new_points, p.param_bytes) * 2 / move_bandwidth + overhead
    return gain > cost and list(new_points) != list(old_points), gain, cost
