"""When training has diverged, and what to tell the user: pure, no I/O.

An epoch whose mean training loss is above chance's (``ln`` of the number of classes: what a model that
guesses uniformly scores) by more than :data:`CHANCE_MARGIN` did worse than guessing: the central node says
so, with the figures and what to change. A deep pipeline's first epoch can be there and recover (MobileNetV2
on 8 stages: 2.6 in the first epoch, 93 % at the end), so the run is ended only when the loss is not finite
(a NaN that reached the weights never leaves them) or has stayed above chance's for
:data:`DIVERGED_EPOCHS` epochs in a row (``TrainConfig.divergence``: ``warn`` never ends it, for
benchmarks that record a baseline's whole curve).
"""

from __future__ import annotations

import math

CHANCE_MARGIN = 0.1
"""How far above chance's loss an epoch's mean may be (10 %): a model stuck at chance (every ReLU dead, a
loss of exactly ln K) has not learnt, but has not blown up either."""
DIVERGED_EPOCHS = 3
"""Epochs in a row above chance's loss that end a run."""


def chance_loss(num_classes: int) -> float:
    """Cross-entropy of a uniform guess over ``num_classes`` classes."""
    return math.log(max(2, num_classes))


def above_chance(mean_loss: float, num_classes: int) -> bool:
    """Whether an epoch's mean training loss says the model did worse than guessing (or is not finite)."""
    return not mean_loss <= chance_loss(num_classes) * (1 + CHANCE_MARGIN)


def ends_run(losses: list[float], num_classes: int) -> bool:
    """Whether the epochs' mean training losses so far end the run: the last not finite, or the last
    :data:`DIVERGED_EPOCHS` all above chance's."""
    if losses and not math.isfinite(losses[-1]):
        return True
    tail = losses[-DIVERGED_EPOCHS:]
    return len(tail) == DIVERGED_EPOCHS and all(above_chance(v, num_classes) for v in tail)


BLOWN_UP = 10.0
"""A batch's training loss this many times chance's: the weights have blown up (a learning rate far too
large); a stage's outputs that turn non-finite next are the divergence's, not a broken device's."""


def blown_up(losses: list[float], num_classes: int) -> bool:
    """Whether the last committed batches' training losses (``losses``: the last few) say the weights blew
    up: one of them not finite or above :data:`BLOWN_UP` times chance's loss."""
    limit = BLOWN_UP * chance_loss(num_classes)
    return any(not loss <= limit for loss in losses)


def diverged_into_nonfinite(batch: int, loss: float, learning_rate: float, stall: str) -> str:
    """The line that ends a run whose loss had blown up when a stage's outputs turned non-finite."""
    return (
        f"loss diverged at batch {batch}: the training loss reached {loss:.3g}, then the stages' outputs "
        f"stopped being finite ({stall}); lower --learning-rate (now {learning_rate:g})"
    )


def loss_not_finite(batch: int, loss: float, learning_rate: float) -> str:
    """The line that ends a run whose training loss of ``batch`` is not finite."""
    return (
        f"loss diverged at batch {batch}: the training loss is {loss}; "
        f"lower --learning-rate (now {learning_rate:g})"
    )


def divergence(
    epoch: int,
    mean_loss: float,
    *,
    num_classes: int,
    learning_rate: float,
    staleness: str,
    in_flight: int,
) -> str | None:
    """What to tell the user after ``epoch`` (its mean training loss ``mean_loss``), or None when it did
    better than guessing."""
    chance = chance_loss(num_classes)
    if not above_chance(mean_loss, num_classes):
        return None
    what = (
        f"is {mean_loss}"
        if not math.isfinite(mean_loss)
        else f"is {mean_loss:.2f}, above chance's {chance:.2f}"
    )
    remedies = [f"lower --learning-rate (now {learning_rate:g}; try {learning_rate / 2:g})"]
    if in_flight > 1:
        if staleness in ("none", "aggregate"):
            remedies.append("compensate the pipeline's staleness (--staleness lookahead)")
        remedies.append("or train without staleness (--in-flight 1, or --schedule sync)")
    return f"loss diverged at epoch {epoch}: its mean training loss {what}; " + ", ".join(remedies)


__all__ = [
    "BLOWN_UP",
    "CHANCE_MARGIN",
    "DIVERGED_EPOCHS",
    "above_chance",
    "blown_up",
    "chance_loss",
    "diverged_into_nonfinite",
    "divergence",
    "ends_run",
    "loss_not_finite",
]
