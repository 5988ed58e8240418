"""Rows of a batch shared among the devices of a replicated stage (hybrid stages): pure, no I/O.

A stage held by ``r`` devices splits every batch's rows among them in proportion to their shares
(:func:`split_rows`); each member forwards and backwards only its rows. The stage before and the stage
after see the batch as pieces, one per member of the sending stage, each naming the rows ``[lo, hi)`` of
the batch's ``total`` it carries. A :class:`RowBuffer` collects the pieces of one batch into whole
tensors, so a receiver takes the rows it computes once they are all there, whatever the split of the
stage that sent them: the two stages' splits need not line up.

A receiver keeps collecting the rows it does not compute too: when a member of its stage dies, the
survivors take its rows over (papers' "failover inside a stage") and need exactly those.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from edgeagent.protocol.messages import Gradient

Rows = tuple[int, int]


def split_rows(total: int, shares: Sequence[float]) -> list[Rows]:
    """Contiguous ``[lo, hi)`` per member, in member order, sizes proportional to ``shares``.

    Cumulative rounding (the same result on every device for the same inputs); every member gets at
    least one row while there are as many rows as members (a member with no rows would have nothing to
    forward, and batch normalisation cannot train on one empty batch); with fewer rows than members the
    last members get empty ranges.
    """
    n = len(shares)
    if n == 0:
        raise ValueError("split_rows needs at least one share")
    if total < 0:
        raise ValueError(f"a batch has {total} rows: must be >= 0")
    whole = sum(shares)
    if not whole > 0 or any(s < 0 for s in shares):
        raise ValueError(f"shares {list(shares)} must be >= 0 with a positive sum")
    if n == 1:
        return [(0, total)]
    bounds = [0]
    acc = 0.0
    for k, share in enumerate(shares):
        acc += share
        cut = total if k == n - 1 else round(total * acc / whole)
        # At least one row per member while rows remain for the members after it.
        low = min(bounds[-1] + 1, total)
        high = max(low, total - (n - 1 - k))
        bounds.append(min(max(cut, low), high))
    return list(itertools.pairwise(bounds))


def rows_of(total: int, shares: Sequence[float], member: int) -> Rows:
    """The rows of member ``member`` (0-based, the order of the stage's group)."""
    return split_rows(total, shares)[member]


class RowBuffer:
    """The pieces of one batch collected into whole columns (``x``, ``y``, a gradient, row losses...).

    Every column has ``total`` rows; a piece fills rows ``[lo, hi)`` of every column it names. The first
    piece to fill a row wins (two members computing the same rows after a failover send equal values).
    """

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError(f"a batch has {total} rows: must be >= 1")
        self.total = total
        self.filled = torch.zeros(total, dtype=torch.bool)
        self.columns: dict[str, torch.Tensor] = {}

    def add(self, lo: int, hi: int, columns: dict[str, torch.Tensor]) -> str | None:
        """Take a piece; None, or why it does not fit (then nothing is taken)."""
        if not 0 <= lo < hi <= self.total:
            return f"rows [{lo}, {hi}) are outside the batch's {self.total}"
        for name, value in columns.items():
            if value.shape[:1] != (hi - lo,):
                return f"{name} has {tuple(value.shape)[:1]} rows, the piece [{lo}, {hi}) has {hi - lo}"
            known = self.columns.get(name)
            if known is not None and (known.shape[1:] != value.shape[1:] or known.dtype != value.dtype):
                return (
                    f"{name} of rows [{lo}, {hi}) is {tuple(value.shape[1:])} {value.dtype}, earlier rows "
                    f"are {tuple(known.shape[1:])} {known.dtype}"
                )
        new = ~self.filled[lo:hi]
        for name, value in columns.items():
            column = self.columns.get(name)
            if column is None:
                column = self.columns[name] = torch.zeros((self.total, *value.shape[1:]), dtype=value.dtype)
            column[lo:hi][new] = value[new]
        self.filled[lo:hi] = True
        return None

    def covers(self, lo: int, hi: int) -> bool:
        return bool(self.filled[lo:hi].all())

    @property
    def complete(self) -> bool:
        return bool(self.filled.all())

    def take(self, lo: int, hi: int) -> dict[str, torch.Tensor]:
        """Rows ``[lo, hi)`` of every column (copies)."""
        if not self.covers(lo, hi):
            raise ValueError(f"rows [{lo}, {hi}) of the batch are not all here")
        return {name: column[lo:hi].clone() for name, column in self.columns.items()}


def gradient_piece(msg: Gradient, g: torch.Tensor) -> tuple[Rows, int, dict[str, torch.Tensor]]:
    """A gradient piece's rows, its batch's total rows and its columns for a :class:`RowBuffer`: the
    gradient ``g`` (restored) and each row's loss and correctness (a whole-batch gradient spreads its
    loss over the rows)."""
    total = msg.total or int(g.shape[0])
    rows = (msg.rows[0], msg.rows[1]) if msg.rows else (0, total)
    row_loss = msg.row_loss if msg.rows else [msg.loss] * total
    row_correct = msg.row_correct if msg.rows else [0] * total
    columns = {
        "g": g,
        "loss": torch.tensor(row_loss, dtype=torch.float64),
        "correct": torch.tensor(row_correct, dtype=torch.int64),
    }
    return rows, total, columns


__all__ = ["RowBuffer", "Rows", "gradient_piece", "rows_of", "split_rows"]
