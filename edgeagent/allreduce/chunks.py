"""The ft-tree's exchange by chunks (issue 54): a flat vector cut into contiguous chunks that travel and
are reduced one by one, so a parent adds chunk k while chunk k+1 is still on the wire and the mean's first
chunk flows down before its last one is summed (pure).

The paper's exchange is one chunk (``chunk_floats=None``): one message per subtree sum and per mean.

Note: a node adds its own gradient, then its children's subtree sums in the children's order (left, then
right), whatever order they arrive in (:class:`ChunkSum` holds a right child's part until the left one is
in). Addition is elementwise, so the sum of every value is the same sequence of float additions however
the vector is cut: the chunked mean equals the unchunked one bit for bit, and neither depends on the order
messages arrive in.
"""

from __future__ import annotations

import torch

CHUNK_FLOATS = 195_584
"""Floats per chunk at most of ``--collective ft-tree``: 195,584 float32 = 764 KiB, the transport's 768 KiB
frame (:data:`edgeagent.protocol.chunking.DEFAULT_CHUNK_SIZE`) less 4 KiB for the message around them, so a
chunk is one MQTT message (no reassembly, no digest of the whole) and a vector takes as few messages as
that frame allows: the thesis's 407,050-parameter MLP travels in 3 chunks of 135,684 floats (530 KiB)
per link and direction (4 of 512 KiB before; the pipelining of smaller chunks gained nothing measurable on
2 cores, and every message costs CPU at both ends, docs/benchmarks.md)."""

MAX_CHUNKS = 1024
"""Chunks at most per vector (checked on decode: a message cannot announce a huge count)."""


def count(numel: int, chunk_floats: int | None) -> int:
    """Chunks of a vector of ``numel`` floats cut into chunks of at most ``chunk_floats`` (None: one)."""
    if chunk_floats is not None and chunk_floats < 1:
        raise ValueError(f"chunk_floats must be >= 1, got {chunk_floats}")
    if chunk_floats is None or numel <= chunk_floats:
        return 1
    return min(MAX_CHUNKS, -(-numel // chunk_floats))


def bounds(numel: int, chunks: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of each of ``chunks`` contiguous chunks of ``numel`` floats, their sizes differing by at
    most one (torch.tensor_split's rule), the larger first."""
    if not 1 <= chunks <= MAX_CHUNKS:
        raise ValueError(f"chunks must be 1..{MAX_CHUNKS}, got {chunks}")
    q, r = divmod(numel, chunks)
    out, lo = [], 0
    for k in range(chunks):
        hi = lo + q + (1 if k < r else 0)
        out.append((lo, hi))
        lo = hi
    return out


class ChunkSum:
    """One chunk's running sum on a tree node: its own part, then its children's subtree sums added in
    ``order`` (see the module doc). ``data`` is a view into the node's sum, added to in place."""

    def __init__(self, own: torch.Tensor, rank: int, order: tuple[int, ...]) -> None:
        self.data = own  # (chunk,)
        self.contrib: set[int] = {rank}
        self.order = order
        self.added = 0  # how many of ``order`` are summed in (a prefix)
        self.held: dict[int, tuple[frozenset[int], torch.Tensor]] = {}  # arrived before their turn

    @property
    def complete(self) -> bool:
        return self.added == len(self.order)

    def offer(self, origin: int, contrib: frozenset[int], data: torch.Tensor) -> str:
        """A subtree sum of child ``origin`` for this chunk: ``"new"`` (kept, and added once its turn
        comes), ``"dup"`` (already counted or held: line 11, "if not received") or ``"bad"`` (overlaps
        what is counted only in part: not from a correct peer)."""
        if origin not in self.order or not contrib:
            return "bad"
        held = self.held.get(origin)
        if contrib <= self.contrib or (held is not None and contrib <= held[0]):
            return "dup"
        if origin in self.order[: self.added] or held is not None or contrib & self.contrib:
            return "bad"
        if any(contrib & c for c, _ in self.held.values()):
            return "bad"
        self.held[origin] = (contrib, data)
        while self.added < len(self.order) and self.order[self.added] in self.held:
            part_contrib, part = self.held.pop(self.order[self.added])
            self.data += part  # line 12, in the children's order
            self.contrib |= part_contrib
            self.added += 1
        return "new"


__all__ = ["CHUNK_FLOATS", "MAX_CHUNKS", "ChunkSum", "bounds", "count"]
