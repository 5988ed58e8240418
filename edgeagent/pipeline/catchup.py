"""A dead stage brought forward from its replica without a rollback (pure compute, no I/O).

Note: recovery without a rollback (``--recovery-mode resume``, docs/design.md "Recovery").
    A stage snapshots at version ``v`` (a replication point) and dies later. The batches ``v .. c-1``
    after its replica are the ones whose updates it lost. Its neighbours still hold what it used for
    each of them: the stage before it kept the activations it sent (its input), the stage after it
    the gradients it sent back (the gradient of its output): :attr:`StageRunner.sent_activations` and
    ``sent_gradients``, the newest ``log_keep`` of each. Replaying those batches on the replica, in
    batch order, forward then backward then the update, applies exactly the updates the dead stage
    applied (the same inputs, the same output gradients, the same weight versions), and yields the
    gradient of its input for each batch: the batches whose gradients never reached the stage before
    it finish with those, as if the dead stage had sent them. Nothing else is replayed and no other
    stage goes back: every stage ends at version ``c`` with every update applied once.

    Exact when every batch's forward version is one the replica has: with one batch in flight (no
    staleness) always. With more in flight, the first ``delay`` batches after ``v`` were forwarded
    with versions before ``v`` that no replica holds; they take version ``v`` (as after a rollback,
    where every stage does so), and the stage's later batches are exact again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from edgeagent.errors import TrainingError
from edgeagent.pipeline.stage import Stage
from edgeagent.protocol.messages import Gradient, Ready, Weights


@dataclass(frozen=True)
class LostBatch:
    """One batch the dead stage lost: its input and the version it was forwarded with as the stage
    before it sent them, and the gradient of its output (``labels`` instead on the last stage)."""

    batch_id: int
    inputs: torch.Tensor  # (B, ...) the stage's input
    version: int  # the version the activation names (vertical sync)
    grad_output: torch.Tensor | None = None  # (B, ...) the gradient of the stage's output
    labels: torch.Tensor | None = None  # (B,) on the last stage


def catch_up(stage: Stage, lost: Sequence[LostBatch]) -> list[torch.Tensor | None]:
    """Replay ``lost`` (consecutive batch ids from ``stage.version``) on ``stage`` in batch order; return
    the gradient of the stage's input for each batch (None on stage 0). The stage ends at version
    ``stage.version + len(lost)``."""
    grads: list[torch.Tensor | None] = []
    for expected, batch in enumerate(lost, start=stage.version):
        if batch.batch_id != expected:
            raise TrainingError(f"catch-up at version {expected} got batch {batch.batch_id}")
        # A version before the replica's is not there: take the replica's (see the module note).
        stage.forward(batch.batch_id, batch.inputs, max(stage.base, batch.version))
        result = stage.backward(batch.batch_id, grad_output=batch.grad_output, labels=batch.labels)
        grads.append(result.grad_input)
    return grads


@dataclass
class Pieces:
    """What the central node collects for a catch-up (modes/pipeline/central/catchup.py; its handlers fill
    it while it waits): the dead stage's replica, the gradients the stage after it sent it, its version."""

    dead: str
    holder: str  # who serves the dead stage's replica
    successor: str  # the device of the stage after the dead one
    since: int  # the replica's version
    plan_id: int
    layers: list[int]
    weights: dict[str, torch.Tensor] | None = None
    momentum: dict[str, torch.Tensor] = field(default_factory=dict)
    gradients: dict[int, Gradient] = field(default_factory=dict)
    version: int | None = None  # the successor's version once it resent
    topics: list[str] = field(default_factory=list)  # what the central node listens to meanwhile

    def accept_weights(self, msg: Weights) -> bool:
        """The replica, fetched; False when ``msg`` is something else."""
        if (
            msg.purpose != "redistribute"
            or msg.plan_id != self.plan_id
            or msg.device_id != self.holder
            or (msg.of_device or msg.device_id) != self.dead
            or msg.version != self.since
        ):
            return False
        self.weights = {k: v for k, v in msg.tensors.items() if int(k.split(".")[1]) in self.layers}
        self.momentum = {k: v for k, v in msg.optimizer.items() if int(k.split(".")[1]) in self.layers}
        return True

    def accept_gradient(self, msg: Gradient, successor_stage: int) -> bool:
        if msg.stage != successor_stage or msg.plan_id != self.plan_id or msg.batch_id < self.since:
            return False
        self.gradients[msg.batch_id] = msg
        return True

    def resent(self, msg: Ready) -> None:
        if msg.device_id == self.successor and msg.plan_id == self.plan_id:
            self.version = msg.version

    @property
    def complete(self) -> bool:
        v = self.version
        return (
            self.weights is not None
            and v is not None
            and all(b in self.gradients for b in range(self.since, v))
        )


__all__ = ["LostBatch", "Pieces", "catch_up"]
