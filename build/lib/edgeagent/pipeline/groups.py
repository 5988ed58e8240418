"""Stages held by several devices (hybrid stages): who holds what, and when a batch's update is whole.

Pure rules, no I/O, shared by the central node and the workers:

* :class:`Groups`: per stage, its devices (the primary, ``worker_list[k]``, first) and their shares of
  every batch's rows; :meth:`Groups.without` is the failover inside a stage (a member is gone, the
  survivors take its share, the first survivor becomes the primary).
* :func:`cover`: the members of a replicated stage each send the parameter gradients of their rows;
  the update of a batch is whole once some of the contributions tile the batch's rows exactly.
  Contributions of an older split and of a newer one may both be there after a failover: any one
  tiling counts, and every member picks the same one (the first found in a fixed order) and adds the
  gradients in row order, so every member applies the same update, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from edgeagent.pipeline.rows import Rows, rows_of


@dataclass(frozen=True)
class Groups:
    """Per stage, its members (primary first) and their shares; ``version`` counts failovers."""

    members: tuple[tuple[str, ...], ...]
    shares: tuple[tuple[float, ...], ...]
    version: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", tuple(tuple(g) for g in self.members))
        object.__setattr__(self, "shares", tuple(tuple(float(x) for x in s) for s in self.shares))
        if len(self.members) != len(self.shares):
            raise ValueError(f"{len(self.members)} groups with {len(self.shares)} share lists")
        seen: set[str] = set()
        for k, (group, share) in enumerate(zip(self.members, self.shares, strict=True)):
            if not group or len(group) != len(share):
                raise ValueError(f"stage {k}: {len(group)} devices with {len(share)} shares")
            if any(not x > 0 for x in share) or abs(sum(share) - 1.0) > 1e-6:
                raise ValueError(f"stage {k}: shares {list(share)} must be > 0 and sum to 1")
            for d in group:
                if d in seen:
                    raise ValueError(f"device {d!r} holds more than one stage (again in stage {k})")
                seen.add(d)

    @classmethod
    def single(cls, worker_list: Sequence[str]) -> Groups:
        """One device per stage (the plain pipeline)."""
        return cls(tuple((d,) for d in worker_list), tuple((1.0,) for _ in worker_list))

    @classmethod
    def of(
        cls,
        worker_list: Sequence[str],
        members: Sequence[Sequence[str]],
        shares: Sequence[Sequence[float]],
        version: int = 0,
    ) -> Groups:
        """From the wire (``Assign.groups`` and ``shares``; empty = one device per stage)."""
        if not members:
            return cls.single(worker_list)
        return cls(tuple(tuple(g) for g in members), tuple(tuple(s) for s in shares), version)

    @property
    def primaries(self) -> list[str]:
        return [g[0] for g in self.members]

    @property
    def devices(self) -> list[str]:
        return [d for g in self.members for d in g]

    @property
    def replicated(self) -> list[int]:
        return [k for k, g in enumerate(self.members) if len(g) > 1]

    def stage_of(self, device: str) -> int | None:
        for k, group in enumerate(self.members):
            if device in group:
                return k
        return None

    def member(self, device: str) -> tuple[int, int]:
        """``(stage, position in its group)`` of a device; ValueError if it holds no stage."""
        for k, group in enumerate(self.members):
            if device in group:
                return k, group.index(device)
        raise ValueError(f"{device!r} holds no stage of {self.members}")

    def rows(self, stage: int, device: str, total: int) -> Rows:
        """The rows of a batch of ``total`` rows that ``device`` computes on ``stage``."""
        return rows_of(total, self.shares[stage], self.members[stage].index(device))

    def without(self, dead: Iterable[str]) -> tuple[Groups, list[int]]:
        """The groups after ``dead`` are gone from replicated stages, and the stages that changed.

        The survivors of a stage keep their relative shares (renormalised); the first survivor becomes
        the primary. A stage whose every member is dead is left as it was (it needs today's recovery):
        the caller checks with :meth:`orphaned`.
        """
        gone = set(dead)
        members, shares, changed = [], [], []
        for k, (group, share) in enumerate(zip(self.members, self.shares, strict=True)):
            keep = [(d, x) for d, x in zip(group, share, strict=True) if d not in gone]
            if keep and len(keep) < len(group):
                whole = sum(x for _, x in keep)
                members.append(tuple(d for d, _ in keep))
                shares.append(tuple(x / whole for _, x in keep))
                changed.append(k)
            else:
                members.append(group)
                shares.append(share)
        if not changed:
            return self, []
        return Groups(tuple(members), tuple(shares), self.version + 1), changed

    def orphaned(self, dead: Iterable[str]) -> list[int]:
        """Stages whose every member is in ``dead``."""
        gone = set(dead)
        return [k for k, g in enumerate(self.members) if all(d in gone for d in g)]

    def to_wire(self) -> tuple[list[list[str]], list[list[float]]]:
        return [list(g) for g in self.members], [list(s) for s in self.shares]


def cover(pieces: Iterable[Rows], total: int) -> list[Rows] | None:
    """Pieces (``[lo, hi)`` row ranges) that tile ``[0, total)`` exactly, in row order, or None.

    Deterministic: among the pieces starting at a row, the longest is tried first (depth-first), so
    every device with the same pieces picks the same tiling.
    """
    by_start: dict[int, list[int]] = {}
    for lo, hi in set(pieces):
        if 0 <= lo < hi <= total:
            by_start.setdefault(lo, []).append(hi)
    for ends in by_start.values():
        ends.sort(reverse=True)
    chain: list[Rows] = []
    dead_ends: set[int] = set()

    def walk(at: int) -> bool:
        if at == total:
            return True
        if at in dead_ends:
            return False
        for hi in by_start.get(at, []):
            chain.append((at, hi))
            if walk(hi):
                return True
            chain.pop()
        dead_ends.add(at)
        return False

    return chain if walk(0) else None


__all__ = ["Groups", "cover"]
