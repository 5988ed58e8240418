"""An all-to-all allreduce: every device sends its gradient to every other and sums what it receives.

Not one of the thesis's collectives: the smallest correct one (no timeouts, no backup path), used to test
the allreduce mode's plumbing on its own and selectable as ``--collective direct``. ``size - 1`` messages
out and in per device and step, so only for a handful of devices.
"""

from __future__ import annotations

import torch

from edgeagent.allreduce.base import CollectiveMsg, Send


class DirectAllreduce:
    """One device's part in one all-to-all step (:class:`edgeagent.allreduce.base.Collective`)."""

    def __init__(self, rank: int, size: int, step: int) -> None:
        self.rank, self.size, self.step = rank, size, step
        self._parts: dict[int, torch.Tensor] = {}
        self._result: torch.Tensor | None = None

    def start(self, grad: torch.Tensor, now: float) -> list[Send]:
        self._parts[self.rank] = grad
        msg = CollectiveMsg(
            "direct", self.step, self.rank, origin=self.rank, contributors=(self.rank,), data=grad
        )
        sends = [Send(peer, msg) for peer in range(self.size) if peer != self.rank]
        self._finish()
        return sends

    def receive(self, msg: CollectiveMsg, now: float) -> list[Send]:
        if msg.kind == "direct" and msg.data is not None and 0 <= msg.sender < self.size:
            self._parts.setdefault(msg.sender, msg.data)
            self._finish()
        return []

    def _finish(self) -> None:
        if self._result is None and self.rank in self._parts and len(self._parts) == self.size:
            total = torch.zeros_like(self._parts[self.rank])
            for r in range(self.size):  # in rank order: every device adds in the same order, bit for bit
                total += self._parts[r]
            self._result = total / self.size

    def tick(self, now: float) -> list[Send]:
        return []

    def next_deadline(self) -> float | None:
        return None

    def result(self) -> torch.Tensor | None:
        return self._result

    def done(self) -> bool:
        return self._result is not None

    def contributors(self) -> tuple[int, ...]:
        return tuple(sorted(self._parts))
