"""One stage's data path, shared by every worker and by stage 0 on the central node.

A :class:`StageRunner` owns the :class:`~edgeagent.pipeline.stage.Stage` (its layers, stashed weight
versions, optimizer), the codecs of what it sends, the shapes of the outputs whose gradients are due,
and the window of its recent step times (they ride with the gradients to the central node, papers/000
Sec. III-D). It accepts an activation or a gradient (returning the decoded message, or why it does not
fit) and builds the outgoing Activation and Gradient messages. The roles only move messages: follow
one batch from stage 0's forward to the last stage and its gradient back without leaving this module
and :mod:`edgeagent.pipeline.stage`.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from edgeagent.compression import CompressionError
from edgeagent.compression.stage import StageCodecs, restore
from edgeagent.pipeline.stage import Stage
from edgeagent.protocol.limits import TensorMeta, activation_problem, gradient_problem
from edgeagent.protocol.messages import Activation, ActivationMode, EvalResult, Gradient

STAGE_TIME_WINDOW = 10  # batches in the moving window of step times (a device that slows down shows)


MAX_LOGGED = 128  # of each kind (the defaults need 103 with 3 devices); a longer period rolls back instead


def log_bound(chain_every: int, in_flight: int) -> int:
    """The messages of each kind a stage keeps for a recovery without a rollback
    (:attr:`StageRunner.log_keep`): two chain intervals and the batches in flight cover the batches since
    the newest replica of the stage after or before it, and since the one before that (a replica still on
    its way at the fault), at most :data:`MAX_LOGGED` (memory: a recovery whose log does not reach back to
    the replica rolls back instead). 0 without chain replication: nothing to replay from."""
    return min(MAX_LOGGED, 2 * chain_every + max(1, in_flight)) if chain_every > 0 else 0


@dataclass(frozen=True)
class GradientPiece:
    """A hybrid member's rows ``[lo, hi)`` of a batch's ``total`` in the gradient it sends back: the loss
    and correctness of each of those rows, and every device's seconds per whole batch from this stage to
    the last (``Gradient.rows`` ... ``Gradient.device_times``)."""

    rows: list[int]
    total: int
    row_loss: list[float]
    row_correct: list[int]
    device_times: dict[str, float]


@dataclass
class StageRunner:
    """A stage, its codecs, its batches in flight and its step-time window (see the module doc)."""

    stage: Stage
    index: int
    codecs: StageCodecs = field(default_factory=StageCodecs)
    # Output (shape, dtype) of every batch forwarded here whose gradient is due: what it must look like.
    outputs: dict[int, TensorMeta] = field(default_factory=dict)
    # Emulated compute (forward + backward) of the latest batches, and of the batch in progress.
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=STAGE_TIME_WINDOW))
    step_seconds: float = 0.0
    # The training messages this stage sent, by batch id, the newest ``log_keep`` of each kind (0: none
    # kept): a recovery without a rollback replays a dead neighbour's lost batches from them
    # (modes/pipeline/central/catchup.py). The messages are the encoded ones, so a replay sees exactly
    # the tensors the dead stage saw.
    log_keep: int = 0
    sent_activations: dict[int, Activation] = field(default_factory=dict)
    sent_gradients: dict[int, Gradient] = field(default_factory=dict)

    @property
    def is_last(self) -> bool:
        return self.stage.is_last

    # -- timing ----------------------------------------------------------------------------------

    def add_compute(self, seconds: float) -> None:
        """Part of the batch in progress: a forward or a backward pass (emulated seconds)."""
        self.step_seconds += seconds

    def batch_done(self) -> None:
        """The batch in progress finished its backward pass here: its time joins the window."""
        self.recent.append(self.step_seconds)
        self.step_seconds = 0.0

    def per_batch(self) -> float:
        """Mean seconds per batch over the window (0 before the first)."""
        return sum(self.recent) / len(self.recent) if self.recent else 0.0

    def reset_timing(self) -> None:
        self.recent.clear()
        self.step_seconds = 0.0

    # -- inbound ---------------------------------------------------------------------------------

    def take_activation(
        self, msg: Activation, *, sample: TensorMeta | None, num_classes: int
    ) -> tuple[Activation | None, str | None]:
        """``(msg decoded, None)`` if this stage can forward it, else ``(None, why not)``."""
        try:
            x = restore(msg.x)
        except CompressionError as exc:
            return None, f"activation of batch {msg.batch_id}: {exc}"
        if x is not msg.x:  # a raw tensor is taken as it came: no copy of the message
            msg = dataclasses.replace(msg, x=x)
        problem = activation_problem(msg.tensor, msg.y, sample=sample, num_classes=num_classes)
        if problem is not None:
            return None, f"activation of batch {msg.batch_id}: {problem}"
        return msg, None

    def take_gradient(self, msg: Gradient) -> tuple[Gradient | None, str | None]:
        """``(msg decoded, None)`` for the gradient of a batch in flight here with its output's shape,
        else ``(None, why not)``: anything else would make the backward pass raise after it took the
        batch out of flight (and lose it)."""
        try:
            g = restore(msg.g)
        except CompressionError as exc:
            return None, f"gradient of batch {msg.batch_id}: {exc}"
        if g is not msg.g:
            msg = dataclasses.replace(msg, g=g)
        problem = gradient_problem(msg.tensor, self.outputs.get(msg.batch_id))
        if problem is not None:
            return None, f"gradient of batch {msg.batch_id}: {problem}"
        return msg, None

    # -- outbound --------------------------------------------------------------------------------

    def activation(
        self,
        out: torch.Tensor,
        y: torch.Tensor,
        *,
        run_id: str,
        plan_id: int,
        batch_id: int,
        version: int,
        mode: ActivationMode,
        epoch: int,
        rows: list[int] | None = None,
        total: int = 0,
    ) -> Activation:
        """The message carrying this stage's output of a batch (compressed as the codecs say); with
        ``rows``, of those rows ``[lo, hi)`` of the batch's ``total`` (a hybrid member's share, a
        micro-batch). A training batch's output shape is kept: its gradient must have it."""
        train = mode == "train"
        if train:
            self.outputs[batch_id] = (tuple(out.shape), out.dtype)
        x = self.codecs.activation(out, epoch=epoch, train=train)
        msg = Activation(
            run_id=run_id,
            plan_id=plan_id,
            stage=self.index,
            batch_id=batch_id,
            version=version,
            mode=mode,
            x=x,
            y=y,
            rows=rows or [],
            total=total if rows else 0,
        )
        if train:
            self._log(self.sent_activations, batch_id, msg)
        return msg

    def _log(self, log: dict[int, Any], batch_id: int, msg: Any) -> None:
        if self.log_keep <= 0:
            return
        log[batch_id] = msg
        while len(log) > self.log_keep:
            del log[min(log)]  # the oldest batch (a replay may have added ids out of order)

    def gradient(
        self,
        grad: torch.Tensor,
        *,
        run_id: str,
        plan_id: int,
        batch_id: int,
        loss: float,
        correct: int,
        downstream: list[float],
        piece: GradientPiece | None = None,
    ) -> Gradient:
        """The gradient of this stage's input for a batch, with this stage's time per batch in front of
        the stage times of the stages after it (for the central node's capacity estimate); ``piece``,
        a hybrid member's rows of the batch (see :class:`GradientPiece`)."""
        g = self.codecs.gradient(grad)
        msg = Gradient(
            run_id=run_id,
            plan_id=plan_id,
            stage=self.index,
            batch_id=batch_id,
            g=g,
            loss=loss,
            correct=correct,
            stage_times=[self.per_batch(), *downstream],
            rows=piece.rows if piece else [],
            total=piece.total if piece else 0,
            row_loss=piece.row_loss if piece else [],
            row_correct=piece.row_correct if piece else [],
            device_times=piece.device_times if piece else {},
        )
        self._log(self.sent_gradients, batch_id, msg)
        return msg

    def result(
        self,
        out: torch.Tensor,
        y: torch.Tensor,
        *,
        run_id: str,
        plan_id: int,
        batch_id: int,
        rows: list[int] | None = None,
        total: int = 0,
    ) -> EvalResult:
        """The last stage's evaluation result of a batch (of its ``rows`` of ``total``, a hybrid member's
        share): its correct predictions and summed loss."""
        return EvalResult(
            run_id=run_id,
            plan_id=plan_id,
            batch_id=batch_id,
            correct=int((out.argmax(dim=1) == y).sum()),
            count=int(y.shape[0]),
            loss_sum=float(torch.nn.functional.cross_entropy(out, y, reduction="sum")),
            rows=rows or [],
            total=total if rows else 0,
        )

    def gradient_arrived(self, batch_id: int) -> None:
        """The batch's gradient is here (about to be applied): its output shape is no longer due."""
        self.outputs.pop(batch_id, None)


__all__ = ["STAGE_TIME_WINDOW", "GradientPiece", "StageRunner", "log_bound"]
