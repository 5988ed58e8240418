"""Recovery policy (papers/000 Sec. III-F; ResPipe, papers/002), as pure functions.

Inputs are what the central node learned from its probe: which devices still run the job and which
weight versions every device can serve (its own snapshots and the replicas it holds for others).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from edgeagent.errors import TrainingError


@dataclass(frozen=True)
class ProbeOutcome:
    """What the probe after a fault found: the recovery case of Sec. III-F and who is where."""

    case: int  # 1: everybody answered; 2: some restarted with their ids; 3: some are gone
    restarted: frozenset[str]
    missing: frozenset[str]


def classify_probe(workers: Collection[str], alive: Collection[str], idle: Collection[str]) -> ProbeOutcome:
    """``workers``: the run's workers; ``alive``: those that answered the ping from within the run;
    ``idle``: devices that announced themselves idle (a worker of the run among them restarted)."""
    restarted = frozenset(d for d in idle if d in workers) - frozenset(alive)
    missing = frozenset(workers) - frozenset(alive) - restarted
    case = 1 if not missing and not restarted else 2 if not missing else 3
    return ProbeOutcome(case, restarted, missing)


@dataclass(frozen=True)
class RecoveryPoint:
    """Roll every stage back to ``version``; old stage i's weights come from ``sources[i]``."""

    version: int
    sources: tuple[str, ...]


def new_worker_list(old: Sequence[str], keep: Collection[str]) -> list[str]:
    """The paper's rule: survivors keep their order; indices above a failed one drop by one.

    (With several failures, substituting each failed worker by its next alive one gives the same list.)
    """
    return [d for d in old if d in keep]


def holders_of(old: Sequence[str], index: int, replicas: int) -> list[str]:
    """Devices that receive stage ``index``'s chain replicas: the next ``replicas`` stages, wrapping to the
    central node (index 0) after the last stage."""
    n = len(old)
    return [old[(index + k) % n] for k in range(1, replicas + 1) if (index + k) % n != index]


def choose_recovery_point(
    old: Sequence[str],
    alive: Collection[str],
    holdings: Mapping[str, Mapping[str, Collection[int]]],
    *,
    replicas: int = 1,
    seeded: bool = True,
    start: int = 0,
) -> RecoveryPoint:
    """The newest version every old stage can be restored to, and who serves each stage.

    ``old[0]`` is the central node (always alive). ``holdings[device][whose]`` lists the versions of
    ``whose`` weights that ``device`` can serve. A stage whose device is alive serves itself; a dead
    (or restarted, hence empty) stage is served by an alive chain holder, else by the central node's
    global replica. With ``seeded``, version 0 (the seeded initial model, which any device rebuilds) is
    always possible; a run that started from other weights (``--resume``, ``--init-weights``) has no
    such fallback, and no version before its ``start`` is ever chosen. Raises :class:`TrainingError`
    when no version can be restored (the replicas of the start were lost with their devices).
    """
    central = old[0]

    def source(i: int, version: int) -> str | None:
        owner = old[i]
        if version == 0 and seeded:
            return owner if owner in alive else central
        if owner in alive and version in holdings.get(owner, {}).get(owner, ()):
            return owner
        for holder in holders_of(old, i, replicas):
            if holder in alive and version in holdings.get(holder, {}).get(owner, ()):
                return holder
        if version in holdings.get(central, {}).get(owner, ()):
            return central  # global replica
        return None

    held = {v for per in holdings.values() for vs in per.values() for v in vs}
    candidates = sorted({v for v in held | ({0} if seeded else set()) if v >= start}, reverse=True)
    for version in candidates:
        sources = [source(i, version) for i in range(len(old))]
        if all(s is not None for s in sources):
            return RecoveryPoint(version, tuple(s for s in sources if s is not None))
    raise TrainingError(
        f"no weight version from {start} on can be restored for every stage of {list(old)} (alive: "
        f"{sorted(alive)}; versions held: {sorted(held)}): the replicas of the start were lost; restart the "
        "run from its checkpoint (edgeagent central --resume FILE)"
    )


def respipe_points(
    points: Sequence[int], old: Sequence[str], dead: Collection[str]
) -> tuple[list[int], list[str]]:
    """ResPipe's recovery: the next alive worker takes over a dead worker's layers (the previous one when
    the dead stage is last); nothing else moves. Returns the new points and worker list."""
    if old[0] in dead:
        raise ValueError("the central node (stage 0) cannot fail")
    keep = [i for i, d in enumerate(old) if d not in dead]
    # A survivor's range now starts where the dead stages right before it started (it takes over their
    # layers); the last survivor also runs to the end (it takes over dead stages after it).
    starts = []
    for i in keep:
        start = points[i]
        prev = i - 1
        while prev > 0 and old[prev] in dead:
            start = points[prev]
            prev -= 1
        starts.append(start)
    starts[0] = 0
    ends = [*starts[1:], points[-1]]
    new_points = [*starts, ends[-1]]
    return new_points, [old[i] for i in keep]


RECOVERIES_WITHOUT_PROGRESS = 3
"""Recoveries in a row after which the run has not got past the batch where the first of them was
needed: then it ends. A fault that a recovery repairs is followed by progress; one that comes back at
the same batch every time (a device that keeps sending values that are not finite, a loss that cannot
be computed) would otherwise make the run recover forever."""


@dataclass
class Stalls:
    """Counts recoveries that made no progress (pure; the training loop reports every fault)."""

    limit: int = RECOVERIES_WITHOUT_PROGRESS
    best: int | None = None  # the highest committed batch id at a fault so far
    in_a_row: int = 0  # faults since then with nothing committed past it
    # Messages dropped as not finite per sending device, as counted when ``best`` last rose.
    baseline: dict[str, int] = field(default_factory=dict)

    def fault(self, committed: int, reason: str, nonfinite: Mapping[str, int]) -> str | None:
        """A fault with batches up to ``committed`` committed; ``nonfinite``: messages of the run dropped so
        far because they held values that are not finite, per sender. Returns why the run must end (the
        ``limit``-th recovery in a row without progress is due), or None: recover."""
        if self.best is None or committed > self.best:
            self.best, self.in_a_row, self.baseline = committed, 0, dict(nonfinite)
            return None
        self.in_a_row += 1
        if self.in_a_row < self.limit:
            return None
        stuck = self.best + 1
        recent = {d: n - self.baseline.get(d, 0) for d, n in nonfinite.items() if n > self.baseline.get(d, 0)}
        if recent:
            device, count = max(recent.items(), key=lambda item: (item[1], item[0]))
            return (
                f"{device} keeps sending values that are not finite ({count} of its messages dropped since "
                f"batch {stuck}); the run made no progress past batch {stuck} in {self.in_a_row} recoveries "
                f"in a row: check {device} (its memory, its software) or start the run without it"
            )
        return (
            f"the run made no progress past batch {stuck} in {self.in_a_row} recoveries in a row; the last "
            f"fault: {reason}"
        )
