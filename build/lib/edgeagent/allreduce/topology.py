"""The fault-tolerant tree of the thesis (papers/001, Fig. 7) and the ring, over ranks ``0..n-1`` (pure).

Ranks are in heap order: the root is 0, the children of ``i`` are ``2i+1`` and ``2i+2`` (those below
``n``), its parent is ``(i-1)//2``. Main links join a node to its parent and children; backup links join
a node to its **brother** (the other child of its parent) and its **uncle** (its parent's brother).
Fig. 7's example: node 3 has parent 1, brother 4 and uncle 2.

Note: the thesis draws complete trees only. For any ``n`` (an incomplete last level) we decide:
- the brother of ``i`` is its sibling if that rank exists (``< n``), else ``None``; the root and the
  last node of an even ``n`` (an only child) have none;
- the uncle of ``i`` is its parent's brother, so ``None`` for the root's children (the root has no
  brother) and wherever that brother does not exist; we add no substitute link, so a node with no
  backup link at all (e.g. rank 1 of ``n=2``) is cut off by one failed main link, as in the thesis.
The backup links of a node are the links to its brother and uncle plus those from the nodes that have it
as brother or uncle (its brother and its nephews); :func:`watchers` names the nodes that watch a node's
messages (its brother and uncle), :func:`watched` the nodes it watches.

Node failures (beyond the thesis): :func:`rebuild` maps the live members, in the order of the current
member list, to ranks ``0..m-1`` so a new tree is laid over them; the mode maps device ids to ranks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from edgeagent.errors import ConfigError


def _check(rank: int, size: int) -> None:
    if size < 1:
        raise ConfigError(f"an allreduce needs at least 1 member, got size={size}")
    if not 0 <= rank < size:
        raise ConfigError(f"rank {rank} is outside 0..{size - 1}")


def parent(rank: int, size: int) -> int | None:
    """The parent of ``rank`` (None for the root)."""
    _check(rank, size)
    return None if rank == 0 else (rank - 1) // 2


def children(rank: int, size: int) -> tuple[int, ...]:
    """The children of ``rank`` that exist, left first."""
    _check(rank, size)
    return tuple(c for c in (2 * rank + 1, 2 * rank + 2) if c < size)


def brother(rank: int, size: int) -> int | None:
    """The other child of ``rank``'s parent, or None (root, only child)."""
    _check(rank, size)
    if rank == 0:
        return None
    sib = rank + 1 if rank % 2 == 1 else rank - 1
    return sib if sib < size else None


def uncle(rank: int, size: int) -> int | None:
    """The brother of ``rank``'s parent, or None (root, its children, a parent without brother)."""
    p = parent(rank, size)
    return None if p is None else brother(p, size)


def watchers(rank: int, size: int) -> tuple[int, ...]:
    """The backup nodes of ``rank`` (brother, then uncle): they watch its main links by timeouts."""
    return tuple(x for x in (brother(rank, size), uncle(rank, size)) if x is not None)


def watched(rank: int, size: int) -> tuple[int, ...]:
    """The nodes that have ``rank`` as a backup node: its brother and its brother's children."""
    b = brother(rank, size)
    return () if b is None else (b, *children(b, size))


def height(size: int) -> int:
    """The height of the heap-ordered tree of ``size`` nodes (0 for a single node)."""
    _check(0, size)
    return (size).bit_length() - 1


def depth(rank: int) -> int:
    """The level of ``rank`` (root 0)."""
    return (rank + 1).bit_length() - 1


@dataclasses.dataclass(frozen=True)
class Node:
    """One rank's place in the fault-tolerant tree."""

    rank: int
    parent: int | None
    children: tuple[int, ...]
    brother: int | None
    uncle: int | None

    @property
    def backups(self) -> tuple[int, ...]:
        """Brother then uncle, those that exist."""
        return tuple(x for x in (self.brother, self.uncle) if x is not None)


def node(rank: int, size: int) -> Node:
    """Everything :mod:`edgeagent.allreduce.ft_tree` needs about ``rank``."""
    return Node(rank, parent(rank, size), children(rank, size), brother(rank, size), uncle(rank, size))


def main_links(size: int) -> list[tuple[int, int]]:
    """Every parent-child link as ``(child, parent)``."""
    return [(c, (c - 1) // 2) for c in range(1, size)]


def backup_links(size: int) -> list[tuple[int, int]]:
    """Every brother and uncle link as ``(node, backup)``, each undirected link once."""
    links: list[tuple[int, int]] = []
    for r in range(1, size):
        b = brother(r, size)
        if b is not None and r < b:
            links.append((r, b))
        u = uncle(r, size)
        if u is not None:
            links.append((r, u))
    return links


def ring_next(rank: int, size: int) -> int:
    """The right neighbour on the ring ``0 -> 1 -> ... -> n-1 -> 0``."""
    _check(rank, size)
    return (rank + 1) % size


def ring_prev(rank: int, size: int) -> int:
    """The left neighbour on the ring."""
    _check(rank, size)
    return (rank - 1) % size


def rebuild(members: Sequence[str], dead: set[str] | frozenset[str]) -> dict[str, int]:
    """Ranks for the live ``members`` (in member-list order) after excluding ``dead`` ones."""
    live = [m for m in members if m not in dead]
    if len(set(live)) != len(live):
        raise ConfigError(f"duplicate members in {list(members)}")
    if not live:
        raise ConfigError(f"no live member left of {len(members)}")
    return {m: r for r, m in enumerate(live)}
