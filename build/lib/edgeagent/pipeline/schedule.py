"""1F1B as data: actions, the per-stage order, validation and an offline simulation.

An :class:`Action` is ``(stage, kind, batch)`` written ``"1F0"`` (stage 1 forwards batch 0). The
runtime does not replay a precomputed list (messages arrive when they arrive); it applies the same
two rules the generated schedule follows on every stage, :func:`admit` with the stage's own bound
(:func:`stage_bound`) and :func:`next_kind`, and the tests check that those rules reproduce
:func:`one_f_one_b` in a tick simulation (``tests/unit/test_pipeline.py``): for every bound up to the
number of stages with equal stages, and for bound 1 whatever the timing. With unequal stages a
backward that arrives early is taken early (still a valid 1F1B order); with more batches in flight
than stages the last stage, whose backward is ready as soon as its forward is done, never warms up.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Kind = Literal["F", "B"]
_ACTION = re.compile(r"^(\d+)([FB])(\d+)$")


@dataclass(frozen=True, order=True)
class Action:
    stage: int
    kind: Kind
    batch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.batch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        m = _ACTION.match(text)
        if not m:
            raise ValueError(f"bad action {text!r}; expected e.g. '1F0'")
        kind: Kind = "F" if m.group(2) == "F" else "B"
        return cls(int(m.group(1)), kind, int(m.group(3)))


Schedule = dict[int, list[Action]]


def admit(in_flight: int, bound: int) -> bool:
    """A stage forwards a new batch only while fewer than ``bound`` batches are in flight on it."""
    return in_flight < bound


def stage_bound(bound: int, stage: int) -> int:
    """Batches stage ``stage`` may hold between forward and backward when stage 0 holds ``bound``:
    1F1B's warm-up, ``bound - stage``, at least one (PipeDream; the DP's memory model assumes it)."""
    return max(1, bound - stage)


def next_kind(last: Kind | None, forward_ready: bool, backward_ready: bool) -> Kind | None:
    """1F1B: alternate when both are ready, else do what is ready (backward first on a tie at start)."""
    if forward_ready and backward_ready:
        return "F" if last == "B" else "B"
    if backward_ready:
        return "B"
    if forward_ready:
        return "F"
    return None


def one_f_one_b(num_stages: int, num_batches: int, in_flight: int) -> Schedule:
    """PipeDream's 1F1B order per stage with at most ``in_flight`` batches between F and B on stage 0.

    Stage ``s`` warms up with ``min(in_flight, num_batches)`` forwards less ``s`` (at least one), then
    alternates backward and forward, then drains the remaining backwards.
    """
    if num_stages < 1 or num_batches < 0 or in_flight < 1:
        raise ValueError(
            f"need num_stages >= 1, num_batches >= 0, in_flight >= 1; got {num_stages}, "
            f"{num_batches}, {in_flight}"
        )
    schedule: Schedule = {}
    for s in range(num_stages):
        warmup = min(num_batches, max(1, min(in_flight, num_batches) - s)) if num_batches else 0
        order = [Action(s, "F", b) for b in range(warmup)]
        f, b = warmup, 0
        while b < num_batches:
            order.append(Action(s, "B", b))
            b += 1
            if f < num_batches:
                order.append(Action(s, "F", f))
                f += 1
        schedule[s] = order
    return schedule


def validate(schedule: Schedule, num_stages: int, num_batches: int, in_flight: int | None = None) -> None:
    """Raise ``ValueError`` unless every stage forwards then backwards every batch exactly once, in
    batch order, with at most ``in_flight`` batches outstanding on stage 0, and the whole thing can run
    without deadlock (checked by simulating it)."""
    if sorted(schedule) != list(range(num_stages)):
        raise ValueError(f"schedule has stages {sorted(schedule)}, expected 0..{num_stages - 1}")
    for s, actions in schedule.items():
        for kind in ("F", "B"):
            batches = [a.batch for a in actions if a.kind == kind]
            if batches != list(range(num_batches)):
                raise ValueError(
                    f"stage {s} does {kind} for batches {batches}, expected 0..{num_batches - 1}"
                )
        seen_f: set[int] = set()
        outstanding = 0
        for a in actions:
            if a.stage != s:
                raise ValueError(f"action {a} is listed under stage {s}")
            if a.kind == "F":
                seen_f.add(a.batch)
                outstanding += 1
            elif a.batch not in seen_f:
                raise ValueError(f"stage {s}: backward of batch {a.batch} before its forward")
            else:
                outstanding -= 1
            if s == 0 and in_flight is not None and outstanding > in_flight:
                raise ValueError(f"stage 0 has {outstanding} batches in flight, bound {in_flight}")
    simulate(schedule, [1.0] * num_stages, [1.0] * num_stages)


@dataclass(frozen=True)
class Simulation:
    makespan: float
    finish: dict[Action, float]

    def throughput(self, num_batches: int) -> float:
        return num_batches / self.makespan if self.makespan else 0.0


def simulate(
    schedule: Schedule,
    forward_time: Sequence[float],
    backward_time: Sequence[float],
    comm_time: Sequence[float] | float = 0.0,
) -> Simulation:
    """Run the schedule on an ideal machine: each stage does its actions in order, one at a time.

    ``comm_time[s]`` is the time to move a tensor between stage ``s`` and ``s + 1`` (both ways).
    Raises ``ValueError`` on deadlock.
    """
    n = len(schedule)
    comm = [float(comm_time)] * n if isinstance(comm_time, (int, float)) else list(comm_time)
    finish: dict[Action, float] = {}
    pos = [0] * n
    free_at = [0.0] * n
    remaining = sum(len(a) for a in schedule.values())
    while remaining:
        progressed = False
        for s in range(n):
            while pos[s] < len(schedule[s]):
                a = schedule[s][pos[s]]
                deps: list[float] = []
                if a.kind == "F" and s > 0:
                    dep = Action(s - 1, "F", a.batch)
                    if dep not in finish:
                        break
                    deps.append(finish[dep] + comm[s - 1])
                if a.kind == "B":
                    own = Action(s, "F", a.batch)
                    if own not in finish:
                        break
                    deps.append(finish[own])
                    if s < n - 1:
                        dep = Action(s + 1, "B", a.batch)
                        if dep not in finish:
                            break
                        deps.append(finish[dep] + comm[s])
                start = max([free_at[s], *deps])
                duration = forward_time[s] if a.kind == "F" else backward_time[s]
                finish[a] = free_at[s] = start + duration
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [str(schedule[s][pos[s]]) for s in range(n) if pos[s] < len(schedule[s])]
            raise ValueError(f"schedule deadlocks; waiting actions: {stuck}")
    return Simulation(makespan=max(finish.values(), default=0.0), finish=finish)
