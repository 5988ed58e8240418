"""One stage's compute step and what it sends on, shared by every worker and by stage 0 on the central node.

A step is a forward (of a whole batch, a micro-batch of the sync schedule, or a hybrid member's rows), a
backward or an evaluation batch on a :class:`~edgeagent.pipeline.stage.Stage`; its emulated slowdown
(:func:`~edgeagent.runtime.compute.emulate_slowdown`, counted in the stage's step time); the message it
sends (the output as an ``Activation``, the input's gradient, the last stage's ``EvalResult``); and the
device's fault hooks (die at a backward pass or an evaluation batch, NaN in what it sends). The worker's
session, the hybrid member's and the central node's training loop each wrote that glue once; a
:class:`StageStep` is the one copy. It holds no node: messages go out through a callable, compute time
into a :class:`~edgeagent.runtime.compute.TimeAccount`, and the fault hooks are a :class:`Faults` (the
worker itself; :data:`NO_FAULTS` on the central node, which injects none). The stage's data path (the
:class:`~edgeagent.pipeline.runner.StageRunner`) is a call argument, since a re-partition replaces it.

The hot path allocates nothing of its own: no closure, no copy of a tensor; the ``Activation`` is built
once, rows included (a ``dataclasses.replace`` would build it twice).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch

from edgeagent.errors import TrainingError
from edgeagent.pipeline.runner import GradientPiece, StageRunner
from edgeagent.pipeline.stage import BackwardResult
from edgeagent.protocol.messages import Message
from edgeagent.protocol.topics import Topics
from edgeagent.runtime import hoptrace
from edgeagent.runtime.compute import Clock, TimeAccount, emulate_slowdown

Send = Callable[[str, Message], int]  # publish ``message`` on ``topic``; the payload's size in bytes


class Faults(Protocol):
    """The fault injection a device does in its compute steps (``--die-at-backward``, ``--die-at-eval``,
    ``--send-nan``, ``--nan-on-usr1``): the worker's :class:`~edgeagent.roles.worker.node.Worker`."""

    def fault_at_backward(self, batch_id: int) -> None: ...

    def fault_at_evaluation(self, batch_id: int) -> None: ...

    def poisoned(self, kind: str, batch: int, tensor: torch.Tensor) -> torch.Tensor: ...


class _NoFaults:
    """No fault injection (the central node's stage 0)."""

    def fault_at_backward(self, batch_id: int) -> None:
        return None

    def fault_at_evaluation(self, batch_id: int) -> None:
        return None

    def poisoned(self, kind: str, batch: int, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


NO_FAULTS: Faults = _NoFaults()


class StageStep:
    """Forward, backward and evaluation steps of one device's stage, with what they send (see the module
    doc). ``send``, ``topics`` and ``device_id`` say where messages go (the stage's topics, as the device
    that computed them); ``account`` is the device's time account (its compute share)."""

    __slots__ = ("_topics", "account", "device_id", "faults", "send", "topics")

    def __init__(
        self,
        send: Send,
        topics: Topics,
        device_id: str,
        account: TimeAccount,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.send = send
        self.topics = topics
        self.device_id = device_id
        self.account = account
        self.faults = faults
        # Where this device sends each kind of output of each stage: built (and the names checked) once.
        self._topics: dict[tuple[str, int], str] = {}

    def _topic(self, kind: str, stage: int) -> str:
        """``topics.activations(stage, device_id)`` (or ``gradients``, ``results``: ``kind``), once each."""
        topic = self._topics.get((kind, stage))
        if topic is None:
            topic = self._topics[(kind, stage)] = getattr(self.topics, kind)(stage, self.device_id)
        return topic

    def forward(
        self,
        runner: StageRunner,
        batch_id: int,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        run_id: str,
        plan_id: int,
        slowdown: float,
        epoch: int,
        version: int | None = None,
        batch: int | None = None,
        rows: list[int] | None = None,
        total: int = 0,
        loss_here: bool = True,
        defer: bool = False,
        started: Clock | None = None,
    ) -> BackwardResult | None:
        """Forward training item ``batch_id`` (a batch, or a micro-batch of the sync schedule) at weight
        ``version`` (None on stage 0), and send its output on to the next stage as an Activation (rows
        ``[lo, hi)`` of ``total`` when ``rows`` are given: a hybrid member's share or a micro-batch).

        On the last stage, with ``loss_here`` (a worker: the labels ``y`` came with the batch), the
        backward from the loss follows at once (``total`` and ``defer`` as :meth:`Stage.backward` takes
        them) and its result is returned, for the caller to send the gradient: the loss may not be
        finite, and then its compute is not counted (the run ends). Without ``loss_here`` (the central
        node running the whole model) the backward is the caller's, later. None when nothing is returned.

        ``batch`` is the batch the fault hooks count (``batch_id`` unless it is a micro-batch's item);
        ``started``, the step's start when the caller's part counts too (loading the batch).
        """
        clock = Clock(slowdown) if started is None else started
        stage = runner.stage
        out, used = stage.forward(batch_id, x, version)
        mark = batch_id if batch is None else batch
        if runner.is_last:
            if not loss_here:
                runner.add_compute(emulate_slowdown(clock, slowdown, self.account))
                return None
            self.faults.fault_at_backward(mark)
            return self._backward(runner, clock, slowdown, batch_id, None, y, total, defer)
        runner.add_compute(emulate_slowdown(clock, slowdown, self.account))
        hoptrace.compute("forward", runner.index, batch_id, clock.wall)
        activation = runner.activation(
            self.faults.poisoned("activation", mark, out),
            y,
            run_id=run_id,
            plan_id=plan_id,
            batch_id=batch_id,
            version=used,
            mode="train",
            epoch=epoch,
            rows=rows,
            total=total,
        )
        runner.codecs.message_sent(self.send(self._topic("activations", runner.index), activation))
        return None

    def backward(
        self,
        runner: StageRunner,
        batch_id: int,
        *,
        slowdown: float,
        grad_output: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        total: int = 0,
        batch: int | None = None,
        defer: bool = False,
        started: Clock | None = None,
    ) -> BackwardResult:
        """Backward of item ``batch_id`` from the next stage's gradient ``grad_output`` (or, on the last
        stage, from ``labels``): its output is no longer due, the fault hook ``--die-at-backward`` (at
        ``batch``) first, the compute counted unless the loss is not finite (the run ends). ``started``
        as :meth:`forward` takes it."""
        runner.gradient_arrived(batch_id)
        self.faults.fault_at_backward(batch_id if batch is None else batch)
        clock = Clock(slowdown) if started is None else started
        return self._backward(runner, clock, slowdown, batch_id, grad_output, labels, total, defer)

    def _backward(
        self,
        runner: StageRunner,
        clock: Clock,
        slowdown: float,
        batch_id: int,
        grad_output: torch.Tensor | None,
        labels: torch.Tensor | None,
        total: int,
        defer: bool,
    ) -> BackwardResult:
        result = runner.stage.backward(batch_id, grad_output, labels, total=total, defer=defer)
        if math.isfinite(result.loss):
            runner.add_compute(emulate_slowdown(clock, slowdown, self.account))
        hoptrace.compute("backward", runner.index, batch_id, clock.wall)
        return result

    def send_gradient(
        self,
        runner: StageRunner,
        grad: torch.Tensor | None,
        *,
        run_id: str,
        plan_id: int,
        batch_id: int,
        loss: float,
        correct: int,
        downstream: list[float],
        batch: int | None = None,
        piece: GradientPiece | None = None,
    ) -> None:
        """Send the gradient of the stage's input for item ``batch_id`` to the stage before (NaN if
        ``--send-nan gradient@batch`` says so), with this stage's time per batch in front of
        ``downstream``'s; ``piece`` sets a hybrid member's fields (its rows, their losses, device times)."""
        if grad is None:
            raise TrainingError(f"stage {runner.index} produced no input gradient for batch {batch_id}")
        gradient = runner.gradient(
            self.faults.poisoned("gradient", batch_id if batch is None else batch, grad),
            run_id=run_id,
            plan_id=plan_id,
            batch_id=batch_id,
            loss=loss,
            correct=correct,
            downstream=downstream,
            piece=piece,
        )
        runner.codecs.message_sent(self.send(self._topic("gradients", runner.index), gradient))

    def evaluate(
        self,
        runner: StageRunner,
        batch_id: int,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        run_id: str,
        plan_id: int,
        slowdown: float,
        version: int = 0,
        rows: list[int] | None = None,
        total: int = 0,
    ) -> None:
        """Evaluate batch ``batch_id`` with the newest weights and send on its output (its result from the
        last stage), after the fault hook ``--die-at-eval``. Evaluation time is not a training step's:
        it goes to the account only."""
        self.faults.fault_at_evaluation(batch_id)
        started = Clock(slowdown)
        out = runner.stage.evaluate(x)
        emulate_slowdown(started, slowdown, self.account)
        if runner.is_last:
            result = runner.result(
                out, y, run_id=run_id, plan_id=plan_id, batch_id=batch_id, rows=rows, total=total
            )
            self.send(self._topic("results", runner.index), result)
            return
        activation = runner.activation(
            out,
            y,
            run_id=run_id,
            plan_id=plan_id,
            batch_id=batch_id,
            version=version,
            mode="eval",
            epoch=0,
            rows=rows,
            total=total,
        )
        runner.codecs.message_sent(self.send(self._topic("activations", runner.index), activation))


__all__ = ["NO_FAULTS", "Faults", "Send", "StageStep"]
