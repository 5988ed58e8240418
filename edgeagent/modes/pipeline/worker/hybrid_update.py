"""A hybrid stage's update: the members' parameter gradients added up (see
:mod:`edgeagent.modes.pipeline.worker.hybrid`).

Every member of a stage computes the parameter gradients of its rows of a batch and sends them to the
others (``GradSync`` on ``stage/<k>/sync``, batch normalisation's running statistics with them). The
update of a batch is applied once the contributions of one groups version cover all its rows
(:func:`edgeagent.pipeline.groups.cover`): every member then applies the same sum, so weight stashing
and vertical sync stay exact. :class:`GroupUpdate` does this for its session (:class:`~.host.HybridHost`).
"""

from __future__ import annotations

import dataclasses

import torch

from edgeagent.modes.pipeline.worker.host import HybridHost
from edgeagent.pipeline.groups import averaged_buffers, set_buffers, summed, whole_update
from edgeagent.pipeline.rows import Rows
from edgeagent.protocol.messages import GradSync


class GroupUpdate:
    """The members' gradient sums of a hybrid stage and the update they make whole (see the module doc)."""

    def __init__(self, session: HybridHost) -> None:
        self.session = session

    def contribute(self, batch_id: int, rows: Rows, total: int, grads: dict[str, torch.Tensor]) -> None:
        """This member's gradients of ``rows`` of batch ``batch_id``: kept, and sent to the others."""
        session = self.session
        run, worker, hy = session.run, session.worker, session.hy
        shared = len(session.group) > 1
        msg = GradSync(
            run_id=run.run_id,
            plan_id=run.plan_id,
            stage=run.index,
            batch_id=batch_id,
            share_version=hy.groups.version,
            device_id=worker.device_id,
            rows=list(rows),
            total=total,
            grads=grads,
            buffers=self._float_buffers() if shared else {},
        )
        hy.syncs.setdefault(batch_id, {}).setdefault(hy.groups.version, {})[worker.device_id] = msg
        if shared:
            sent = {name: worker.poisoned("sync", batch_id, g) for name, g in grads.items()}
            topic = worker.topics.syncs(run.index, worker.device_id)
            worker.send(topic, dataclasses.replace(msg, grads=sent))

    def _whole(self, batch_id: int) -> list[GradSync] | None:
        """The contributions that make the batch's update whole (one groups version), in row order."""
        return whole_update(self.session.hy.syncs.get(batch_id, {}))

    def _float_buffers(self) -> dict[str, torch.Tensor]:
        return {
            name: b.detach().clone()
            for name, b in self.session.run.stage.module.named_buffers()
            if b.is_floating_point()
        }

    def _average_buffers(self, parts: list[GradSync]) -> None:
        """Batch normalisation's running statistics: the row-weighted mean of the members' (each
        normalised only its rows), so every member holds the same."""
        set_buffers(
            self.session.run.stage.module,
            averaged_buffers(dict(self.session.run.stage.module.named_buffers()), parts),
        )

    def can_apply(self) -> bool:
        hy = self.session.hy
        return (
            hy.leaving is None and self.session.run.switch is None and self._whole(hy.next_apply) is not None
        )

    def apply(self) -> None:
        """Apply the next batch's update, whole now: the sum of the members' gradients."""
        session = self.session
        run, hy = session.run, session.hy
        batch_id = hy.next_apply
        parts = self._whole(batch_id)
        assert parts is not None
        run.stage.apply_gradients(summed(parts))
        self._average_buffers(parts)
        run.stage.forget(batch_id)  # computed again after a failover, but whole already: drop it
        run.stage.unpin(batch_id)
        hy.next_apply = batch_id + 1
        run.next_forward = max(run.next_forward, batch_id + 1)
        run.next_backward = max(run.next_backward, batch_id + 1)
        lo, hi = hy.rows.get(batch_id, (0, 0))
        hy.forget(batch_id)
        run.batches += 1
        run.samples += hi - lo
        session.replicas.batch_done(batch_id)


__all__ = ["GroupUpdate"]
