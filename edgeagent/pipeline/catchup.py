"""A dead stage brought forward from its replica without a rollback (pure compute, no I/O).

Note: recovery without a rollback (``--recovery-mode resume``, docs/design.md "Recovery").
    A stage snapshots at version ``v`` (a replication point) and dies later. The batches ``v .. c-1``
    after its replica are the ones whose updates it lost. Its neighbours still hold what it used for
    each of them: the stage before it kept the activations it sent (its input, with the labels), the
    stage after it the gradients it sent back (the gradient of its output):
    :attr:`StageRunner.sent_activations` and ``sent_gradients``, the newest ``log_keep`` of each.
    Replaying those batches on the replica, in batch order, forward then backward then the update,
    applies exactly the updates the dead stage applied (the same inputs, the same output gradients, the
    same weight versions), and yields the gradient of its input for each batch: the batches whose
    gradients never reached the stage before it finish with those, as if the dead stage had sent them.
    Nothing else is replayed and no other stage goes back: every stage ends at version ``c`` with every
    update applied once.

    Which ``c`` (FTPipeHD, papers/000 Sec. III-F: every stage resumes at one batch):

    * a stage with a successor: the successor's version once it has drained (every batch it sent on
      came back), so that no stage after it is ahead of it; the dead stage had applied exactly those;
    * the last stage (no successor): the batches the stage before it sent it. Their loss needs only
      the labels that ride with the activations, so the replay goes past the dead stage's own version
      (the batches whose gradients it never sent) and finishes them all.

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
from edgeagent.pipeline.stage import BackwardResult, Stage
from edgeagent.protocol.messages import Activation, Gradient, Ready, Weights


@dataclass(frozen=True)
class LostBatch:
    """One batch the dead stage lost: its input and the version it was forwarded with as the stage
    before it sent them, and the gradient of its output (``labels`` instead on the last stage)."""

    batch_id: int
    inputs: torch.Tensor  # (B, ...) the stage's input
    version: int  # the version the activation names (vertical sync)
    grad_output: torch.Tensor | None = None  # (B, ...) the gradient of the stage's output
    labels: torch.Tensor | None = None  # (B,) on the last stage


def replay(stage: Stage, lost: Sequence[LostBatch]) -> list[BackwardResult]:
    """Replay ``lost`` (consecutive batch ids from ``stage.version``) on ``stage`` in batch order; return
    each batch's backward (the gradient of the stage's input, None on stage 0; the loss and the correct
    count on the last stage). The stage ends at version ``stage.version + len(lost)``."""
    results: list[BackwardResult] = []
    for expected, batch in enumerate(lost, start=stage.version):
        if batch.batch_id != expected:
            raise TrainingError(f"catch-up at version {expected} got batch {batch.batch_id}")
        if (batch.labels is None) == (batch.grad_output is None):
            raise TrainingError(f"catch-up of batch {batch.batch_id}: labels or an output gradient, not both")
        # A version before the replica's is not there: take the replica's (see the module note).
        stage.forward(batch.batch_id, batch.inputs, max(stage.base, batch.version))
        results.append(stage.backward(batch.batch_id, grad_output=batch.grad_output, labels=batch.labels))
    return results


def catch_up(stage: Stage, lost: Sequence[LostBatch]) -> list[torch.Tensor | None]:
    """:func:`replay`'s gradients of the stage's input, one per batch."""
    return [result.grad_input for result in replay(stage, lost)]


@dataclass
class Pieces:
    """What the central node collects for a catch-up (modes/pipeline/central/catchup.py; its handlers fill
    it while it waits): the dead stage's replica, the activations the stage before it sent it (from the
    central node's own log when that is stage 0), the gradients the stage after it sent it (none after the
    last stage), and where each of those two stages stands."""

    dead: str
    stage: int  # the dead stage's index
    holder: str  # who serves the dead stage's replica
    successor: str | None  # the device of the stage after the dead one (None: the dead one is the last)
    predecessor: str | None  # the device of the stage before it (None: the central node's stage 0)
    since: int  # the replica's version
    plan_id: int
    layers: list[int]
    weights: dict[str, torch.Tensor] | None = None
    momentum: dict[str, torch.Tensor] = field(default_factory=dict)
    gradients: dict[int, Gradient] = field(default_factory=dict)
    activations: dict[int, Activation] = field(default_factory=dict)
    version: int | None = None  # the successor's version once it resent
    sent: int | None = None  # one past the newest batch the stage before sent the dead one
    before: int | None = None  # the version of the stage before (its batches from there on wait)
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

    def accept_gradient(self, msg: Gradient) -> bool:
        if (
            self.successor is None
            or msg.stage != self.stage + 1
            or msg.plan_id != self.plan_id
            or msg.batch_id < self.since
        ):
            return False
        self.gradients[msg.batch_id] = msg
        return True

    def accept_activation(self, msg: Activation) -> bool:
        if (
            self.predecessor is None
            or msg.stage != self.stage - 1
            or msg.plan_id != self.plan_id
            or msg.mode != "train"
            or msg.batch_id < self.since
        ):
            return False
        self.activations[msg.batch_id] = msg
        return True

    def resent(self, msg: Ready) -> None:
        if msg.plan_id != self.plan_id:
            return
        if msg.device_id == self.successor:
            self.version = msg.version
        elif msg.device_id == self.predecessor:
            self.sent, self.before = msg.sent, msg.version

    @property
    def until(self) -> int | None:
        """One past the last batch to replay: the successor's version, else what the dead stage was sent."""
        return self.version if self.successor is not None else self.sent

    @property
    def complete(self) -> bool:
        until = self.until
        if self.weights is None or until is None:
            return False
        lost = range(self.since, until)
        if self.successor is not None and any(b not in self.gradients for b in lost):
            return False
        if self.predecessor is None:
            return True
        return self.before is not None and all(b in self.activations for b in lost)


__all__ = ["LostBatch", "Pieces", "catch_up", "replay"]
