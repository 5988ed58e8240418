"""A hybrid stage member's intake (see :mod:`edgeagent.modes.pipeline.worker.hybrid`).

:class:`RowIntake`, a collaborator of the member's session (:class:`~.host.HybridHost`), takes the pieces
of the batches not yet updated on its stage as they arrive (inputs and gradients as rows of a
:class:`~edgeagent.pipeline.rows.RowBuffer`, the other members' gradient sums), checking each against the
stage before keeping it in the session's :class:`~.hybrid_state.HybridState`.
"""

from __future__ import annotations

import torch

from edgeagent.compression import CompressionError
from edgeagent.compression.stage import restore
from edgeagent.modes.pipeline.worker.host import HybridHost
from edgeagent.pipeline.rows import RowBuffer, gradient_piece
from edgeagent.protocol.messages import Activation, Gradient, GradSync, Message
from edgeagent.runtime.role import Handler, Inbound


def input_problem(msg: Activation, central: str, sender: str) -> str | None:
    """Why a piece of input rows for a helper of stage 0 is not one, or None: it comes from the central
    node (which holds the data), as a training batch's rows of "stage -1" (the data)."""
    if sender != central:
        return f"input rows from {sender!r}: only the central node {central!r} holds the data"
    if msg.stage != -1:
        return f"input rows of stage {msg.stage}: they are the data's (stage -1)"
    if msg.mode != "train":
        return "input rows of an evaluation batch: the central node evaluates stage 0 alone"
    if not msg.rows:
        return "input rows without their rows: a helper computes some of a batch's"
    return None


class RowIntake:
    """The intake of a hybrid stage member: pieces of batches into its :class:`HybridState`."""

    def __init__(self, session: HybridHost) -> None:
        self.session = session

    def handlers(self) -> dict[type[Message], Handler]:
        return {Activation: self.on_activation, Gradient: self.on_gradient, GradSync: self.on_sync}

    def on_activation(self, item: Inbound) -> None:
        msg, run, hy = item.message, self.session.run, self.session.hy
        assert isinstance(msg, Activation)
        if not run.matches(msg.run_id, msg.plan_id):
            return
        if run.index == 0:
            wrong = input_problem(msg, run.worker_list[0], item.topic.device or "")
            if wrong is not None:
                self.session.worker.discard(item, f"activation of batch {msg.batch_id}: {wrong}")
                return
        train = msg.mode == "train"
        if train and msg.batch_id < hy.next_apply:
            return  # already updated here (a duplicate, or a piece computed again after a failover)
        problem = run.activation_problem(msg)
        # Evaluation pieces stay until training goes on (a failover computes them again): count those due.
        due = sum(1 for eid in hy.evals if eid not in hy.eval_done)
        if problem is None and not train and msg.batch_id not in hy.evals and due >= run.eval_window:
            problem = f"{due} evaluation batches already wait here (at most {run.eval_window})"
        taken: Activation | None = None
        if problem is None:
            taken, problem = run.runner.take_activation(
                msg, sample=run.sample, num_classes=run.spec.num_classes
            )
        if taken is not None:
            problem = self._take_piece(taken)
        if problem is not None:
            self.session.worker.discard(item, f"activation of batch {msg.batch_id}: {problem}")

    def _take_piece(self, msg: Activation) -> str | None:
        hy = self.session.hy
        y = msg.y
        total = msg.total or int(y.shape[0])
        lo, hi = msg.rows or (0, total)
        if y.shape[:1] != (hi - lo,):
            return f"{tuple(y.shape)[:1]} labels for rows [{lo}, {hi})"
        train = msg.mode == "train"
        buffers, versions = (hy.inputs, hy.versions) if train else (hy.evals, hy.eval_versions)
        buffer = buffers.get(msg.batch_id)
        if buffer is None:
            buffer = buffers[msg.batch_id] = RowBuffer(total)
            versions[msg.batch_id] = msg.version
        elif buffer.total != total:
            return f"a piece of {total} rows, earlier pieces said {buffer.total}"
        elif train and versions[msg.batch_id] != msg.version:
            return f"weight version {msg.version}, earlier pieces said {versions[msg.batch_id]}"
        return buffer.add(lo, hi, {"x": msg.tensor, "y": y})

    def on_gradient(self, item: Inbound) -> None:
        msg, run, hy = item.message, self.session.run, self.session.hy
        assert isinstance(msg, Gradient)
        if not run.matches(msg.run_id, msg.plan_id) or msg.batch_id < hy.next_apply:
            return
        problem = None
        if msg.batch_id >= run.next_forward + run.window:
            problem = f"more than {run.window} batches ahead of the next one here ({run.next_forward})"
        else:
            problem = self._take_gradient(msg)
        if problem is not None:
            self.session.worker.discard(item, f"gradient of batch {msg.batch_id}: {problem}")

    def _take_gradient(self, msg: Gradient) -> str | None:
        hy = self.session.hy
        try:
            g = restore(msg.g)
        except CompressionError as exc:
            return str(exc)
        (lo, hi), total, columns = gradient_piece(msg, g)
        expected = self._output_meta()
        if g.shape[:1] != (hi - lo,) or (expected is not None and (tuple(g.shape[1:]), g.dtype) != expected):
            return f"shape {tuple(g.shape)} {g.dtype} does not fit rows [{lo}, {hi}) of this stage's output"
        buffer = hy.grads.get(msg.batch_id)
        if buffer is None:
            buffer = hy.grads[msg.batch_id] = RowBuffer(total)
        elif buffer.total != total:
            return f"a piece of {total} rows, earlier pieces said {buffer.total}"
        problem = buffer.add(lo, hi, columns)
        if problem is None:
            hy.times.setdefault(msg.batch_id, {}).update(msg.device_times)
        return problem

    def _output_meta(self) -> tuple[tuple[int, ...], torch.dtype] | None:
        """One sample of this stage's output (the layer profile), for checking gradient pieces."""
        run = self.session.run
        last = run.points[run.index + 1] - 1
        if len(run.layer_shapes) <= last or len(run.layer_dtypes) <= last:
            return None
        dtype = getattr(torch, run.layer_dtypes[last], None)
        if not isinstance(dtype, torch.dtype):
            return None
        return tuple(run.layer_shapes[last]), dtype

    def on_sync(self, item: Inbound) -> None:
        msg, run, hy = item.message, self.session.run, self.session.hy
        assert isinstance(msg, GradSync)
        if not run.matches(msg.run_id, msg.plan_id) or msg.stage != run.index:
            return
        worker = self.session.worker
        if msg.device_id == worker.device_id or msg.batch_id < hy.next_apply:
            return  # our own (kept locally), or an update applied already
        if msg.batch_id >= hy.next_apply + run.window:
            worker.discard(item, f"gradient sync of batch {msg.batch_id}: too far ahead")
            return
        params = dict(run.stage.module.named_parameters())
        wrong = [
            name
            for name in set(params) | set(msg.grads)
            if name not in params or name not in msg.grads or msg.grads[name].shape != params[name].shape
        ]
        if wrong:
            worker.discard(
                item, f"gradient sync of batch {msg.batch_id}: parameters {sorted(wrong)} do not fit"
            )
            return
        hy.syncs.setdefault(msg.batch_id, {}).setdefault(msg.share_version, {})[msg.device_id] = msg


__all__ = ["RowIntake", "input_problem"]
