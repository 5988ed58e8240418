"""Evaluation: the test set streamed through the pipeline in eval mode, at the end of every epoch."""

from __future__ import annotations

import logging
import time

import torch

from edgeagent.errors import DivergedError
from edgeagent.modes.pipeline.central.context import Fault, RunState
from edgeagent.modes.pipeline.central.liveness import Liveness
from edgeagent.modes.pipeline.central.planning import Planning
from edgeagent.pipeline.divergence import DIVERGED_EPOCHS, divergence, ends_run

log = logging.getLogger("edgeagent.roles.central")


class Evaluation:
    """Test accuracy and loss with the newest weights; a device that stops meanwhile is a fault."""

    def __init__(self, state: RunState, planning: Planning, liveness: Liveness) -> None:
        self.state = state
        self.planning = planning
        self.liveness = liveness

    def evaluate(self) -> tuple[float, float] | Fault:
        """Test accuracy with the newest weights, streamed through the pipeline in eval mode.

        At most :meth:`_eval_bound` chunks are in flight. The deadline is for the *next* result, derived
        from the measured step (planner/deadlines.py), so a long test set on a slow cluster is never cut
        off while results keep coming; a device that dies meanwhile is a fault like one in training
        (returned to the training loop, which recovers and evaluates again).
        """
        state = self.state
        stage, data = state.stage, state.data
        bs = state.train.eval_batch_size
        n = data.x_test.shape[0]
        chunks = [(i, data.x_test[i : i + bs], data.y_test[i : i + bs]) for i in range(0, n, bs)]
        correct = 0
        loss_sum = 0.0
        if stage.is_last:
            for _, x, y in chunks:
                out = stage.evaluate(x)
                correct += int((out.argmax(dim=1) == y).sum())
                loss_sum += float(torch.nn.functional.cross_entropy(out, y, reduction="sum"))
            return correct / max(1, n), loss_sum / max(1, n)
        state.inbox.results.clear()
        state.inbox.eval_ids = {eid for eid, _, _ in chunks}
        try:
            fault = self._stream(chunks)
        finally:
            state.inbox.eval_ids = set()
        if fault is not None:
            return fault
        for r in state.inbox.results.values():
            correct += r.correct
            loss_sum += r.loss_sum
        return correct / max(1, n), loss_sum / max(1, n)

    def _stream(self, chunks: list[tuple[int, torch.Tensor, torch.Tensor]]) -> Fault | None:
        """Send the chunks, at most :meth:`_eval_bound` ahead of the results, until every result is in."""
        state = self.state
        bound, timeout = self.liveness.eval_bound(), self.liveness.eval_deadline()
        sent = 0
        last_result = time.monotonic()
        while len(state.inbox.results) < len(chunks):
            while sent < len(chunks) and sent - len(state.inbox.results) < bound:
                self._send_eval_chunk(*chunks[sent])
                sent += 1
            before = len(state.inbox.results)
            fault = self.liveness.wait_for_messages()
            if fault is not None:
                return fault
            now = time.monotonic()
            if len(state.inbox.results) > before:
                last_result = now
            elif now - last_result > timeout:
                return Fault(
                    [],
                    f"evaluation results are late: {before} of {len(chunks)} in, none for "
                    f"{timeout:.1f} s (deadline from the measured step)",
                )
        return None

    def _send_eval_chunk(self, eid: int, x: torch.Tensor, y: torch.Tensor) -> None:
        state = self.state
        state.stage_step.evaluate(
            state.runner,
            eid,
            x,
            y,
            run_id=state.run_id,
            plan_id=state.plan_id,
            slowdown=state.config.slowdown,
        )

    def _check_divergence(self, epoch: int, mean_loss: float) -> None:
        """End the run (``divergence: stop``, the default) or say so (``warn``) when the epoch's training
        loss says it blew up (pipeline.divergence)."""
        state = self.state
        why = divergence(
            epoch,
            mean_loss,
            num_classes=state.spec.num_classes,
            learning_rate=state.train.learning_rate,
            staleness=state.train.staleness,
            in_flight=state.bound(),
        )
        if why is None:
            return
        state.report.diverged = why
        if state.train.divergence == "stop" and ends_run(
            state.report.train_loss_per_epoch, state.spec.num_classes
        ):
            raise DivergedError(
                f"{why}; the run stops (not finite, or above chance's {DIVERGED_EPOCHS} epochs in a row)"
            )
        log.error(
            "%s (the run goes on; it stops when the loss is not finite or above chance's %d epochs in a row)",
            why,
            DIVERGED_EPOCHS,
        )

    def end_epoch(self, committed_b: int, losses: list[float]) -> Fault | None:
        """Evaluate at the end of an epoch and record its figures; a fault meanwhile is returned."""
        state = self.state
        per_epoch, report = state.per_epoch, state.report
        epoch = committed_b // per_epoch
        evaluated = self.evaluate()
        if isinstance(evaluated, Fault):
            return evaluated
        acc, test_loss = evaluated
        tail = losses[-per_epoch:]
        # An epoch replayed after a recovery overwrites its earlier figures.
        del report.test_accuracy_per_epoch[epoch:], report.test_loss_per_epoch[epoch:]
        del report.train_loss_per_epoch[epoch:]
        report.test_accuracy_per_epoch.append(acc)
        report.test_loss_per_epoch.append(test_loss)
        report.train_loss_per_epoch.append(sum(tail) / max(1, len(tail)))
        log.info("epoch %d: test accuracy %.2f%%, test loss %.4f", epoch, 100 * acc, test_loss)
        self._check_divergence(epoch, report.train_loss_per_epoch[-1])
        state.node.notifier.status(f"run {state.run_id}: epoch {epoch} test accuracy {100 * acc:.1f}%")
        if state.codecs.sent_bytes:
            log.info(
                "stage 0 sent %.1f MB for %.1f MB of tensors (ratio %.1f; %.1f with the messages' envelopes)",
                state.codecs.sent_bytes / 1e6,
                state.codecs.raw_bytes / 1e6,
                state.codecs.tensor_ratio,
                state.codecs.ratio,
            )
        self.planning.apply_compression(epoch=epoch + 1)
        state.event("epoch", epoch=epoch, accuracy=acc, loss=test_loss, batch=committed_b)
        state.notify(epoch=epoch, accuracy=acc)
        return None
