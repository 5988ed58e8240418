"""The exact hybrid DP: the optimal plan of :mod:`edgeagent.planner.hybrid`'s cost model, with its tie rule.

Algorithm (:func:`solve_hybrid`). Devices with equal ``(capacity, bandwidth, latency, memory_limit)``
are interchangeable, so a group is a multiset of device *types* (counts per type). A suffix of the
pipeline depends only on the state ``(s, used, prev, slot)``: the first layer left, the counts of
devices already used per type, the type multiset of the previous stage (for the link in front) and, with
memory limits, the stage position that ``f`` depends on. Pass 1 computes the optimal bottleneck by a
memoised min-max recursion over these states; pass 2 repeats it keeping only components within the
tolerance and minimising the tie key, whose groups are mapped to concrete devices by taking each type's
lowest unused indices in stage order (which is the lexicographically smallest choice for given types).
"""

from __future__ import annotations

import itertools

from edgeagent.planner.hybrid import (
    INF,
    CostModel,
    Counts,
    GroupStats,
    HybridPlan,
    HybridProblem,
    TieKey,
    plan_from_key,
    tie_threshold,
)

# --------------------------------------------------------------------------------------------------
# The exact DP


class _Slots:
    """How many batches are in flight on a stage, as a small state ``slot`` of the recursion.

    * No memory limit anywhere: memory never matters, ``slot`` is always 0.
    * ``in_flight == 0``: ``f = n - k`` is the number of stages from ``k`` to the end, so ``slot`` counts
      the stages still to place (the suffix must have exactly that many).
    * ``in_flight > 0``: ``f = max(1, in_flight - k)``, so ``slot`` is the stage index ``k``, capped where
      ``f`` stops changing.
    """

    def __init__(self, p: HybridProblem, limited: bool) -> None:
        self.mode = "free" if not limited else ("tail" if p.in_flight == 0 else "head")
        self.in_flight = p.in_flight
        self.cap = max(1, p.in_flight - 1)

    def starts(self, num_layers: int, num_devices: int) -> list[tuple[int, int]]:
        """``(f of stage 0, slot of stage 1)`` for every way the pipeline may start."""
        if self.mode == "free":
            return [(1, 0)]
        if self.mode == "head":
            return [(self.in_flight, min(1, self.cap))]
        return [(n, n - 1) for n in range(1, min(num_layers, num_devices) + 1)]

    def in_flight_of(self, slot: int) -> int:
        if self.mode == "tail":
            return slot
        return max(1, self.in_flight - slot) if self.mode == "head" else 1

    def following(self, slot: int) -> int:
        if self.mode == "tail":
            return slot - 1
        return min(slot + 1, self.cap) if self.mode == "head" else 0

    def can_end(self, slot: int) -> bool:
        return self.mode != "tail" or slot == 0

    def stages_left(self, slot: int) -> int:
        """Stages that must still follow this one (only known when they are counted)."""
        return slot - 1 if self.mode == "tail" else 0


_Option = tuple[Counts, Counts, GroupStats]  # (group, used after it, its statistics)


class _Search:
    """The memoised recursion over ``(s, used, prev, slot)``: the best suffix from layer ``s``."""

    def __init__(self, model: CostModel) -> None:
        self.model = model
        self.slots = _Slots(model.p, model.limited)
        self.groups = self._all_groups()
        self._options: dict[Counts, list[_Option]] = {}
        self._times: dict[tuple[int, Counts, Counts, int], float] = {}
        self._keys: dict[tuple[int, Counts, Counts, int], TieKey | None] = {}
        self._concrete: dict[tuple[Counts, Counts], tuple[int, ...]] = {}
        self.threshold = INF

    def _all_groups(self) -> list[Counts]:
        cap, model = self.model.p.max_replicas, self.model
        ranges = [range(1)] + [range(c + 1) for c in model.counts[1:]]  # never the central node
        return [
            g
            for g in itertools.product(*ranges)
            if sum(g) > 0 and (cap is None or sum(g) <= cap) and model.shares_allowed(g)
        ]

    def options(self, used: Counts) -> list[_Option]:
        found = self._options.get(used)
        if found is None:
            limits = self.model.counts
            found = []
            for g in self.groups:
                after = tuple(u + x for u, x in zip(used, g, strict=True))
                if all(a <= c for a, c in zip(after, limits, strict=True)):
                    found.append((g, after, self.model.stats(g)))
            self._options[used] = found
        return found

    def _last_end(self, s: int, option: _Option, slot: int) -> int:
        """The last end layer a stage from ``s`` may take, or ``s`` when the option cannot work."""
        left = self.slots.stages_left(slot)
        spare = sum(self.model.counts) - sum(option[1])
        return s if spare < left else self.model.num_layers - left

    # Pass 1: the optimal bottleneck -------------------------------------------------------------

    def suffix_time(self, s: int, used: Counts, prev: Counts, slot: int) -> float:
        key = (s, used, prev, slot)
        found = self._times.get(key)
        if found is None:
            found = self._times[key] = self._best_time(s, used, prev, slot)
        return found

    def _best_time(self, s: int, used: Counts, prev: Counts, slot: int) -> float:
        model, slots = self.model, self.slots
        if s == model.num_layers:
            return 0.0 if slots.can_end(slot) else INF
        if slots.mode == "tail" and slot == 0:
            return INF
        f, following, best = slots.in_flight_of(slot), slots.following(slot), INF
        for option in self.options(used):
            group, after, st = option
            link = model.link(prev, group, s)
            if link >= best:
                continue
            for e in range(s + 1, self._last_end(s, option, slot) + 1):
                if not model.fits(st, s, e, f):
                    break
                stage = model.stage_time(st, s, e)
                if stage >= best:
                    break
                value = max(link, stage, self.suffix_time(e, after, group, following))
                best = min(best, value)
        return best

    def optimum(self) -> float:
        model, best = self.model, INF
        for first in model.first_groups():
            st, feed = model.stats(first), model.feed(first)
            if feed >= best:
                continue
            for f, slot in self.slots.starts(model.num_layers, len(model.type_of)):
                for e in range(1, model.first_end(first) + 1):
                    if not model.fits(st, 0, e, f):
                        break
                    stage = model.stage_time(st, 0, e)
                    if stage >= best:
                        break
                    best = min(best, max(stage, feed, self.suffix_time(e, first, first, slot)))
        return best

    # Pass 2: the tie rule among plans within the threshold --------------------------------------

    def concrete(self, group: Counts, used: Counts) -> tuple[int, ...]:
        """The lowest unused device indices of each type, ascending."""
        found = self._concrete.get((group, used))
        if found is None:
            members = self.model.members
            picked = (members[t][used[t] + i] for t, c in enumerate(group) for i in range(c))
            found = self._concrete[(group, used)] = tuple(sorted(picked))
        return found

    def suffix_key(self, s: int, used: Counts, prev: Counts, slot: int) -> TieKey | None:
        """The smallest tie key of a suffix from ``s`` whose every component is within the threshold."""
        key = (s, used, prev, slot)
        if key not in self._keys:
            self._keys[key] = self._best_key(s, used, prev, slot)
        return self._keys[key]

    def _best_key(self, s: int, used: Counts, prev: Counts, slot: int) -> TieKey | None:
        model, slots, limit = self.model, self.slots, self.threshold
        if s == model.num_layers:
            return (0, 0, (-s,), ()) if slots.can_end(slot) else None
        if slots.mode == "tail" and slot == 0:
            return None
        f, following = slots.in_flight_of(slot), slots.following(slot)
        best: TieKey | None = None
        for option in self.options(used):
            if model.link(prev, option[0], s) > limit:
                continue
            ends = range(s + 1, self._last_end(s, option, slot) + 1)
            candidate = self._stage_key(s, ends, option, used, f, following)
            if candidate is not None and (best is None or candidate < best):
                best = candidate
        return best

    def _stage_key(
        self, s: int, ends: range, option: _Option, used: Counts, f: int, following: int
    ) -> TieKey | None:
        """The smallest tie key of a plan whose stage from ``s`` is held by ``option``'s group (``used``
        devices taken before it), ending at one of ``ends``, within the threshold."""
        model, limit = self.model, self.threshold
        group, after, st = option
        best: TieKey | None = None
        for e in ends:
            if not model.fits(st, s, e, f) or model.stage_time(st, s, e) > limit:
                break
            if self.suffix_time(e, after, group, following) > limit:
                continue
            rest = self.suffix_key(e, after, group, following)
            if rest is None:  # pragma: no cover - suffix_time <= limit guarantees a suffix
                continue
            candidate = (
                st.size + rest[0],
                1 + rest[1],
                (*rest[2], -s),
                (self.concrete(group, used), *rest[3]),
            )
            if best is None or candidate < best:
                best = candidate
        return best

    def best_key(self, threshold: float) -> TieKey | None:
        self.threshold = threshold
        model, best = self.model, None
        nothing = (0,) * len(model.counts)
        for first in model.first_groups():
            st = model.stats(first)
            if model.feed(first) > threshold:
                continue
            for f, slot in self.slots.starts(model.num_layers, len(model.type_of)):
                ends = range(1, model.first_end(first) + 1)
                candidate = self._stage_key(0, ends, (first, first, st), nothing, f, slot)
                if candidate is not None and (best is None or candidate < best):
                    best = candidate
        return best


def solve_hybrid(p: HybridProblem) -> HybridPlan:
    """The optimal hybrid plan (exact), with the module's tie rule. Raises ``ValueError`` if no plan fits
    the memory limits.

    Pass 1 finds the optimal bottleneck, pass 2 the plan with the smallest tie key among those whose every
    stage and link is within ``optimum * (1 + 1e-12)``; both recurse over ``(s, used, prev, slot)`` states
    (see the module docstring), so identical devices cost nothing extra.
    """
    model = CostModel(p)
    search = _Search(model)
    optimum = search.optimum()
    if optimum == INF:
        raise model.infeasible()
    key = search.best_key(tie_threshold(optimum))
    if key is None:  # pragma: no cover - the optimum itself is within the threshold
        raise AssertionError(f"no plan within the optimum {optimum}")
    return plan_from_key(model, key)


__all__ = ["solve_hybrid"]
