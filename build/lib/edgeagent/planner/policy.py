"""When to re-split and which split to take (papers/000 Sec. III-D), as pure functions.

The central node measures; these decide. ``RepartitionPolicy`` says when a plan check is due;
:func:`choose_plan` runs the DP and keeps the current split unless the predicted gain over the next
interval beats the cost of moving the weights (a device that joins always gets a new split).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edgeagent.planner.dp import Problem, predict, repartition_gain, solve


@dataclass(frozen=True)
class RepartitionPolicy:
    """When to re-split: after ``first`` batches of epoch 0, then every ``every`` batches."""

    first: int = 10
    every: int = 100

    def due(self, done: int) -> bool:
        """``done`` = batches whose backward pass has finished."""
        return done == self.first or (done > self.first and (done - self.first) % self.every == 0)


@dataclass(frozen=True)
class SplitChoice:
    """The split to run next, its predicted seconds per batch, and why."""

    points: list[int]
    predicted: float
    reason: str


def choose_plan(
    problem: Problem,
    current: Sequence[int],
    *,
    joiners: Sequence[str] = (),
    horizon_batches: int,
    move_bandwidth: float,
) -> SplitChoice:
    """The DP's split for ``problem`` if it is worth moving to from ``current`` (or devices join)."""
    proposed = solve(problem)
    predicted = predict(problem, proposed)
    caps = ", ".join(f"{c:.2f}" for c in problem.capacities)
    if joiners:
        # A device joined (or came back after it was dropped): it takes part from this split on.
        return SplitChoice(proposed, predicted, f"{list(joiners)} joined; capacities {caps}")
    worth, gain, cost = repartition_gain(
        problem, current, proposed, horizon_batches=horizon_batches, move_bandwidth=move_bandwidth
    )
    if not worth:
        return SplitChoice(
            list(current),
            predict(problem, current),
            f"kept (capacities {caps}; gain {gain:.2f} s <= cost {cost:.2f} s)",
        )
    reason = f"capacities {caps}; predicted gain {gain:.2f} s > move cost {cost:.2f} s"
    return SplitChoice(proposed, predicted, reason)


__all__ = ["RepartitionPolicy", "SplitChoice", "choose_plan"]
