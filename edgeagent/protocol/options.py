"""The optimizer settings a run's stages share, as the central node sends them in ``Assign``: plain data.

They sit here, under the protocol, because they are part of the wire format (``Assign.options``); the
pipeline (:mod:`edgeagent.pipeline.stage`, :mod:`.sgd`, :mod:`.staleness`) computes with them and the
configuration (``TrainConfig``) fills them. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Staleness = Literal["none", "aggregate", "predict", "nesterov", "lookahead", "2bw"]
"""How a stage compensates its delay (:mod:`edgeagent.pipeline.staleness` holds the rules)."""
LrSchedule = Literal["constant", "cosine", "step"]
"""The learning rate over the run (:func:`edgeagent.pipeline.sgd.rate_factor`); ``step``: times
``lr_gamma`` at each of ``lr_steps`` (the epochs of ``TrainConfig.lr_milestones`` in updates)."""


def milestone_steps(milestones: tuple[int, ...], batches_per_epoch: int) -> tuple[int, ...]:
    """The updates where a ``step`` schedule's milestone epochs begin (epoch ``m`` starts at update
    ``m * batches_per_epoch``, 0-based)."""
    return tuple(m * batches_per_epoch for m in milestones)


@dataclass(frozen=True)
class TrainOptions:
    """The optimizer settings every stage of a run shares: the one type for them, from the run's
    ``TrainConfig`` (:meth:`of`) to ``Assign`` and every stage built. ``staleness`` is the rule a stage
    compensates its delay with (:mod:`edgeagent.pipeline.staleness`); ``none`` here, the plain rule, while
    a run takes ``TrainConfig``'s default."""

    learning_rate: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    staleness: Staleness = "none"
    # Aggregate every window * interval updates (the paper: "an interval which is a multiple of n - i").
    aggregation_interval: int = 1
    # The learning rate over the run (pipeline.sgd.rate_factor) and the run's updates in all (the central
    # node's; 0: constant).
    lr_schedule: LrSchedule = "constant"
    total_batches: int = 0
    # ``step``: the updates at which the rate is multiplied by ``lr_gamma`` (the central node's, from the
    # milestone epochs and its batches per epoch; a step is counted once it is reached).
    lr_steps: tuple[int, ...] = ()
    lr_gamma: float = 0.1
    # The synchronous schedule (``--schedule sync``): every batch is this many micro-batches, numbered
    # ``batch * micro_batches + j`` on the wire, whose gradients make one update; 0: the asynchronous one.
    micro_batches: int = 0

    def batch_of(self, item: int) -> int:
        """The batch a training message's id belongs to (its micro-batch's, under the sync schedule)."""
        return item // self.micro_batches if self.micro_batches else item

    def first_item(self, batch_id: int) -> int:
        """The id of batch ``batch_id``'s first message (its first micro-batch's, under the sync schedule)."""
        return batch_id * self.micro_batches if self.micro_batches else batch_id

    @classmethod
    def of(cls, source: object) -> TrainOptions:
        """The options of a run's training settings (``TrainConfig``) or of an ``Assign``."""
        return cls(
            **{name: getattr(source, name) for name in cls.__dataclass_fields__ if hasattr(source, name)}
        )
