"""The ring allreduce (papers/001 §5.2, Fig. 5; Horovod's), the thesis's baseline: no fault tolerance.

The flat gradient is cut into ``size`` chunks (``torch.tensor_split``: sizes differ by at most one, some
may be empty). Reduce-scatter: rank ``r`` sends chunk ``r`` to its right neighbour; each rank adds its
own part of an arriving chunk and passes it on until the chunk holds every contributor (after ``size-1``
hops, at rank ``c-1`` for chunk ``c``), which divides it by ``size``. Allgather: that rank sends the mean
chunk round the ring once more, each rank keeping and passing it on until it would return to it. A
rank's result is the concatenation once it holds every mean chunk. A failed link stalls the step.

Note: ring messages reuse the ``data_reduce`` (reduce-scatter) and ``data_bcast`` (allgather) kinds,
and carry the **chunk index in ``target``** (no new field in
:class:`~edgeagent.allreduce.base.CollectiveMsg`);
``contributors`` are the ranks summed into that chunk.
"""

from __future__ import annotations

import torch

from edgeagent.allreduce import topology
from edgeagent.allreduce.base import CollectiveMsg, LinkTimeouts, Send
from edgeagent.allreduce.step import UntimedCollective


class RingAllreduce(UntimedCollective):
    """One device's part in one ring allreduce step."""

    label = "ring"

    def __init__(self, rank: int, size: int, step: int, timeouts: LinkTimeouts) -> None:
        # timeouts unused: the ring has none (same signature as the rest); 2 * size + 4 is more than a
        # correct neighbour sends before this device starts
        super().__init__(rank, size, step, timeouts, max_early=2 * size + 4)
        self.right = topology.ring_next(rank, size)
        self.left = topology.ring_prev(rank, size)
        self._chunks: list[torch.Tensor] = []
        self._contrib: list[set[int]] = []
        self._final: dict[int, torch.Tensor] = {}

    def start(self, grad: torch.Tensor, now: float) -> list[Send]:
        flat = self._begin(grad)
        self._chunks = [c.clone() for c in torch.tensor_split(flat, self.size)]
        self._contrib = [{self.rank} for _ in range(self.size)]
        return self._replay_early(self._complete(self.rank) if self.size == 1 else [self._rs(self.rank)], now)

    def receive(self, msg: CollectiveMsg, now: float) -> list[Send]:
        if self._deferred(msg):
            return []
        c = msg.target
        if (
            msg.sender != self.left
            or c is None
            or not 0 <= c < self.size
            or msg.data is None
            or msg.data.shape != self._chunks[c].shape
        ):
            self.rejected += 1
            return []
        contrib = set(msg.contributors)
        if msg.kind == "data_reduce":
            if not contrib or contrib & self._contrib[c] or c in self._final:
                self.rejected += 1
                return []
            self._chunks[c] += msg.data
            self._contrib[c] |= contrib
            if len(self._contrib[c]) == self.size:
                return self._complete(c)
            return [self._rs(c)]
        if msg.kind == "data_bcast":
            if c in self._final or contrib != set(range(self.size)):
                self.rejected += 1
                return []
            return self._keep(c, msg.data.clone(), forward=self.right != (c - 1) % self.size)
        self.rejected += 1
        return []

    def contributors(self) -> tuple[int, ...]:
        """Every rank once this device holds the mean (each mean chunk was checked to have them all)."""
        return tuple(range(self.size)) if self._mean is not None else ()

    def _rs(self, c: int) -> Send:
        contrib = tuple(sorted(self._contrib[c]))
        msg = CollectiveMsg("data_reduce", self.step, self.rank, self.rank, c, contrib, self._chunks[c])
        return Send(self.right, msg)

    def _complete(self, c: int) -> list[Send]:
        return self._keep(c, self._chunks[c] / self.size, forward=self.size > 1)

    def _keep(self, c: int, mean: torch.Tensor, *, forward: bool) -> list[Send]:
        self._final[c] = mean
        out: list[Send] = []
        if forward:
            everyone = tuple(range(self.size))
            msg = CollectiveMsg("data_bcast", self.step, self.rank, self.rank, c, everyone, mean)
            out.append(Send(self.right, msg))
        if len(self._final) == self.size:
            self._mean = torch.cat([self._final[i] for i in range(self.size)])
        return out
