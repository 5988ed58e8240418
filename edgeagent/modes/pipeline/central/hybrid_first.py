"""Stage 0 held by the central node and helpers (the hybrid mode's ``replicate_first`` plans).

The central node holds the data. When the plan gives stage 0 helpers, every training batch's rows are
split among stage 0's members by their shares (:meth:`Groups.rows`, the central node first): the central
node sends each helper its rows of the batch's inputs and labels (an ``Activation`` of "stage -1" on
``stage/0/input/<central>``, with ``rows``/``total`` and the weight version the batch is forwarded
with), forwards its own rows, and every member sends its activation rows to stage 1 as any member of a
replicated stage does. Backward: stage 1's gradient pieces reach every member of stage 0; each
backwards its rows and sends its parameter gradients (``GradSync`` on ``stage/0/sync``); the central
node commits a batch once the members' contributions tile its rows and applies their sum, as the helpers
do (:func:`edgeagent.pipeline.groups.whole_update`): stage 0's copies stay equal.

Failover: a helper that dies is dropped from stage 0 (``Reshare``, by the hybrid liveness); the central
node takes its rows back (:meth:`FirstStage.redo`): every batch in flight is forwarded again under the
new shares at the version it was first forwarded with (pinned until its update), the surviving helpers
sent their new rows; the batch being backwarded is computed again over the central node's new rows.
Evaluation batches are the central node's alone (stage 0's copies are equal).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from edgeagent.modes.pipeline.central.context import Fault, RunState
from edgeagent.pipeline.groups import averaged_buffers, set_buffers, summed, whole_update
from edgeagent.pipeline.rows import Rows
from edgeagent.protocol.messages import Activation, Gradient, GradSync
from edgeagent.runtime.compute import Clock
from edgeagent.runtime.role import Inbound

log = logging.getLogger("edgeagent.roles.central")

BatchOf = Callable[[int], tuple[torch.Tensor, torch.Tensor]]  # a batch's inputs and labels by its id


@dataclass
class FirstBatch:
    """A training batch in flight through a replicated stage 0: the central node's rows, the batch's
    rows, the weight version it is forwarded with."""

    rows: Rows
    total: int
    version: int


def input_pieces(groups_rows: list[Rows], members: tuple[str, ...], central: str) -> list[tuple[str, Rows]]:
    """The helpers' rows of a batch (``groups_rows``: every member's, in member order): what the central
    node sends, one piece per helper with rows (a helper with none gets nothing)."""
    return [(d, r) for d, r in zip(members, groups_rows, strict=True) if d != central and r[1] > r[0]]


@dataclass
class FirstStage:
    """The central node's side of a replicated stage 0 (see the module doc)."""

    state: RunState
    batches: dict[int, FirstBatch] = field(default_factory=dict)
    syncs: dict[int, dict[int, dict[str, GradSync]]] = field(default_factory=dict)
    redo_due: bool = False  # stage 0's members changed: the batches in flight are forwarded again
    changes: int = 0  # how many times stage 0's members changed
    fault: Fault | None = None  # a fault found while a batch waited for the members' sums

    @property
    def members(self) -> tuple[str, ...]:
        return self.state.groups.members[0]

    @property
    def active(self) -> bool:
        """Whether stage 0 has helpers in the current plan."""
        return len(self.members) > 1 and len(self.state.groups.members) > 1

    def members_changed(self) -> None:
        """A helper of stage 0 is gone (a failover): the central node takes its rows back."""
        self.redo_due = True
        self.changes += 1

    def clear(self) -> None:
        """A switch or a recovery: the batches in flight are gone."""
        for bid in self.batches:
            self.state.stage.unpin(bid)
        self.batches.clear()
        self.syncs.clear()
        self.redo_due = False

    # -- forward -------------------------------------------------------------------------------

    def forward(
        self, bid: int, x: torch.Tensor, y: torch.Tensor, epoch: int, version: int | None = None
    ) -> None:
        """The central node's rows of batch ``bid`` forwarded, the helpers' sent to them."""
        state = self.state
        started = Clock(state.config.slowdown)
        total = int(y.shape[0])
        if version is None:
            version = state.stage.version_for(bid)
        state.stage.pin(bid, version)  # kept until its update: a failover forwards it again at it
        self._send_inputs(bid, x, y, version)
        lo, hi = state.groups.rows(0, state.device_id, total)
        self.batches[bid] = FirstBatch((lo, hi), total, version)
        state.runner.step_seconds = 0.0
        state.stage_step.forward(
            state.runner,
            bid,
            x[lo:hi],
            y[lo:hi],
            run_id=state.run_id,
            plan_id=state.plan_id,
            slowdown=state.config.slowdown,
            epoch=epoch,
            version=version,
            rows=[lo, hi],
            total=total,
            loss_here=False,
            started=started,
        )

    def _send_inputs(self, bid: int, x: torch.Tensor, y: torch.Tensor, version: int) -> None:
        state = self.state
        total = int(y.shape[0])
        members = self.members
        rows = [state.groups.rows(0, d, total) for d in members]
        topic = state.topics.inputs(state.device_id)
        for _device, (lo, hi) in input_pieces(rows, members, state.device_id):
            state.send(
                topic,
                Activation(
                    run_id=state.run_id,
                    plan_id=state.plan_id,
                    stage=-1,
                    batch_id=bid,
                    version=version,
                    mode="train",
                    x=x[lo:hi].contiguous(),
                    y=y[lo:hi].contiguous(),
                    rows=[lo, hi],
                    total=total,
                ),
            )

    # -- backward and the members' sum ----------------------------------------------------------

    def expected_rows(self, bid: int) -> int | None:
        """The rows of batch ``bid`` whose gradient the central node collects (None: not in flight here)."""
        first = self.batches.get(bid)
        return None if first is None else first.total

    def backward(self, bid: int, grad: Gradient) -> None:
        """Backward of the central node's rows of ``bid`` from the batch's whole gradient; its parameter
        gradients kept and sent to the helpers."""
        state = self.state
        first = self.batches[bid]
        lo, hi = first.rows
        result = state.stage_step.backward(
            state.runner,
            bid,
            slowdown=state.config.slowdown,
            grad_output=grad.tensor[lo:hi],
            defer=True,
            started=Clock(state.config.slowdown),
        )
        self._contribute(bid, first, result.param_grads or {})

    def backward_whole(
        self, bid: int, grad: Gradient, wait: Callable[[], Fault | None], batch_of: BatchOf
    ) -> bool:
        """Backward of the central node's rows of ``bid``, then wait (``wait``: for messages, checking
        liveness) for the helpers' gradient sums and apply the whole update; False if a fault came first
        (kept in :attr:`fault` for the training loop)."""
        self.backward(bid, grad)
        seen = self.changes
        since = time.monotonic()
        while not self.try_apply(bid):
            fault = wait()
            if fault is None and time.monotonic() - since > self.state.batch_deadline:
                # A helper's sum was dropped (not finite, or lost): the batch timer's fault, as for any
                # batch whose update never becomes whole; the recovery replays it.
                fault = Fault(
                    [],
                    f"stage 0's gradient sums of batch {bid} are late "
                    f"(timer {self.state.batch_deadline:.1f} s)",
                )
            if fault is not None:
                self.fault = fault
                return False
            if self.changes != seen:  # a helper died: its rows of this batch are the central node's now
                seen = self.changes
                since = time.monotonic()
                self.recompute(bid, grad, batch_of)
        return True

    def _contribute(self, bid: int, first: FirstBatch, grads: dict[str, torch.Tensor]) -> None:
        state = self.state
        msg = GradSync(
            run_id=state.run_id,
            plan_id=state.plan_id,
            stage=0,
            batch_id=bid,
            share_version=state.groups.version,
            device_id=state.device_id,
            rows=list(first.rows),
            total=first.total,
            grads=grads,
            buffers={
                name: b.detach().clone()
                for name, b in state.stage.module.named_buffers()
                if b.is_floating_point()
            },
        )
        self.syncs.setdefault(bid, {}).setdefault(state.groups.version, {})[state.device_id] = msg
        state.send(state.topics.syncs(0, state.device_id), msg)

    def on_sync(self, item: Inbound) -> str | None:
        """A helper's gradient sum of its rows: kept until its batch's update; None, or why not."""
        msg = item.message
        assert isinstance(msg, GradSync)
        state = self.state
        if msg.run_id != state.run_id or msg.plan_id != state.plan_id or msg.stage != 0:
            return None  # another run's or plan's: stale
        if msg.device_id == state.device_id or msg.batch_id not in self.batches:
            return None  # our own, or a batch committed already (or not forwarded: stale)
        params = dict(state.stage.module.named_parameters())
        wrong = sorted(
            name
            for name in set(params) | set(msg.grads)
            if name not in params or name not in msg.grads or msg.grads[name].shape != params[name].shape
        )
        if wrong:
            return f"gradient sync of batch {msg.batch_id}: parameters {wrong} do not fit"
        self.syncs.setdefault(msg.batch_id, {}).setdefault(msg.share_version, {})[msg.device_id] = msg
        return None

    def try_apply(self, bid: int) -> bool:
        """Apply batch ``bid``'s update if the members' contributions make it whole; whether it was."""
        parts = whole_update(self.syncs.get(bid, {}))
        if parts is None:
            return False
        state = self.state
        state.stage.apply_gradients(summed(parts))
        set_buffers(state.stage.module, averaged_buffers(dict(state.stage.module.named_buffers()), parts))
        state.stage.forget(bid)
        state.stage.unpin(bid)
        self.batches.pop(bid, None)
        self.syncs.pop(bid, None)
        return True

    # -- failover --------------------------------------------------------------------------------

    def redo(self, batches: list[int], batch_of: BatchOf) -> None:
        """Stage 0's members changed: forward every batch in ``batches`` (in flight, not backwarded here)
        again under the new shares, at the version it was forwarded with."""
        self.redo_due = False
        for bid in batches:
            first = self.batches.get(bid)
            if first is None:
                continue
            x, y = batch_of(bid)
            self.state.stage.forget(bid)
            self.forward(bid, x, y, bid // max(1, self.state.per_epoch), version=first.version)
        if batches:
            log.info("stage 0: batches %d..%d forwarded again under the new shares", batches[0], batches[-1])

    def recompute(self, bid: int, grad: Gradient, batch_of: BatchOf) -> None:
        """Stage 0's members changed while batch ``bid`` waits for their sums: forward and backward the
        central node's new rows of it (the helpers left get their new rows)."""
        first = self.batches[bid]
        x, y = batch_of(bid)
        self.state.stage.forget(bid)
        self.forward(bid, x, y, bid // max(1, self.state.per_epoch), version=first.version)
        self.backward(bid, grad)


__all__ = ["FirstBatch", "FirstStage", "input_pieces"]
