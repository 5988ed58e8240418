"""The standard tree allreduce (papers/001 §5.3, Fig. 6), the thesis's baseline: no backup links.

Each node adds its children's subtree sums to its gradient and sends the sum to its parent
(``data_reduce``); the root divides by ``size`` and the mean flows down (``data_bcast``). Nothing is
watched and nothing times out: a failed link stalls the step, and :meth:`TreeAllreduce.result` stays
None on every node below it (and, in the reduce, on every node). The ranks and tree are those of
:mod:`edgeagent.allreduce.topology`; messages carry ``origin`` and ``contributors`` like the ft-tree's.
"""

from __future__ import annotations

import torch

from edgeagent.allreduce import topology
from edgeagent.allreduce.base import CollectiveMsg, LinkTimeouts, Send
from edgeagent.allreduce.step import UntimedCollective


class TreeAllreduce(UntimedCollective):
    """One device's part in one plain tree allreduce step."""

    label = "tree"

    def __init__(self, rank: int, size: int, step: int, timeouts: LinkTimeouts) -> None:
        # timeouts unused: the plain tree has none (same signature as the rest); 8 is more than a
        # correct neighbour sends before this device starts
        super().__init__(rank, size, step, timeouts, max_early=8)
        self.node = topology.node(rank, size)
        self._sum: torch.Tensor | None = None
        self._contrib: set[int] = set()
        self._children_in: set[int] = set()
        self._sent_up = False

    def start(self, grad: torch.Tensor, now: float) -> list[Send]:
        self._sum = self._begin(grad).clone()
        self._contrib = {self.rank}
        return self._replay_early(self._maybe_send_up(), now)

    def receive(self, msg: CollectiveMsg, now: float) -> list[Send]:
        if self._deferred(msg):
            return []
        assert self._sum is not None
        if msg.data is None or msg.data.shape != self._sum.shape:
            self.rejected += 1
            return []
        contrib = set(msg.contributors)
        if msg.kind == "data_reduce" and msg.sender in self.node.children:
            if msg.sender in self._children_in or not contrib or contrib & self._contrib:
                self.rejected += 1
                return []
            self._sum += msg.data
            self._contrib |= contrib
            self._children_in.add(msg.sender)
            return self._maybe_send_up()
        if msg.kind == "data_bcast" and msg.sender == self.node.parent and self._mean is None:
            if contrib != set(range(self.size)):
                self.rejected += 1
                return []
            self._contrib = contrib
            return self._on_mean(msg.data.clone())
        self.rejected += 1
        return []

    def contributors(self) -> tuple[int, ...]:
        """The ranks summed so far on this node (all ranks once it holds the mean)."""
        return tuple(sorted(self._contrib))

    def _maybe_send_up(self) -> list[Send]:
        if self._sent_up or not set(self.node.children) <= self._children_in:
            return []
        self._sent_up = True
        assert self._sum is not None
        if self.node.parent is None:
            return self._on_mean(self._sum / self.size)
        return [self._msg(self.node.parent, "data_reduce", self._sum)]

    def _on_mean(self, mean: torch.Tensor) -> list[Send]:
        self._mean = mean
        return [self._msg(ch, "data_bcast", mean) for ch in self.node.children]

    def _msg(self, to: int, kind: str, data: torch.Tensor) -> Send:
        contrib = tuple(sorted(self._contrib))
        return Send(to, CollectiveMsg(kind, self.step, self.rank, self.rank, to, contrib, data))
