"""What a hybrid stage member keeps about the batches not yet updated on its stage (see
:mod:`edgeagent.modes.pipeline.worker.hybrid`): plain state, filled by :mod:`.hybrid_intake`."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgeagent.pipeline.groups import Groups
from edgeagent.pipeline.rows import RowBuffer, Rows
from edgeagent.protocol.messages import GradSync


@dataclass
class HybridState:
    """A member's bookkeeping of the batches not yet updated on its stage (see the module doc)."""

    groups: Groups
    next_apply: int  # the first batch whose update is not applied here
    inputs: dict[int, RowBuffer] = field(default_factory=dict)  # training inputs (x, y) by batch
    versions: dict[int, int] = field(default_factory=dict)  # weight version of each training batch
    grads: dict[int, RowBuffer] = field(default_factory=dict)  # gradients from the next stage by batch
    times: dict[int, dict[str, float]] = field(default_factory=dict)  # device times riding with them
    rows: dict[int, Rows] = field(default_factory=dict)  # the rows this member forwarded of each batch
    syncs: dict[int, dict[int, dict[str, GradSync]]] = field(default_factory=dict)  # batch, version, device
    evals: dict[int, RowBuffer] = field(default_factory=dict)  # evaluation inputs by batch
    eval_versions: dict[int, int] = field(default_factory=dict)
    eval_done: dict[int, int] = field(default_factory=dict)  # batch -> the groups version it was done for
    leaving: int | None = None  # the plan without this device: serve its fetches until the commit

    def clear(self, next_apply: int) -> None:
        self.next_apply = next_apply
        for table in (self.inputs, self.versions, self.grads, self.times, self.rows, self.syncs):
            table.clear()
        self.clear_evals()

    def clear_evals(self) -> None:
        self.evals.clear()
        self.eval_versions.clear()
        self.eval_done.clear()

    def forget(self, batch_id: int) -> None:
        for table in (self.inputs, self.versions, self.grads, self.times, self.rows, self.syncs):
            table.pop(batch_id, None)


__all__ = ["HybridState"]
