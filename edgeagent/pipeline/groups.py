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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgeagent.pipeline.rows import Rows, rows_of

if TYPE_CHECKING:
    import torch

    from edgeagent.protocol.messages import GradSync


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

    def indexed(self, index: Mapping[str, int]) -> tuple[list[list[int]], list[list[float]]]:
        """The groups as the planner's device indices (``index``), ascending within a stage, with each
        member's share in the same order; KeyError for a device ``index`` lacks."""
        pairs = [
            sorted((index[d], x) for d, x in zip(g, s, strict=True))
            for g, s in zip(self.members, self.shares, strict=True)
        ]
        return [[d for d, _ in m] for m in pairs], [[x for _, x in m] for m in pairs]

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


def whole_update(by_version: Mapping[int, Mapping[str, GradSync]]) -> list[GradSync] | None:
    """The members' contributions (``GradSync``, per share version, per device) that make a batch's update
    whole: those of the first share version whose rows tile the batch, in row order; None if none does.
    Every member of the stage (the central node for stage 0 too) picks the same ones."""
    for _version, by_device in sorted(by_version.items()):
        if not by_device:
            continue
        pieces = {(m.rows[0], m.rows[1]): m for m in by_device.values()}
        total = next(iter(by_device.values())).total
        tiling = cover(pieces, total)
        if tiling is not None:
            return [pieces[rows] for rows in tiling]
    return None


def summed(parts: Sequence[GradSync]) -> dict[str, torch.Tensor]:
    """The batch's parameter gradients: the members' added up in row order (bit for bit the same sum on
    every member)."""
    total: dict[str, torch.Tensor] = {}
    for part in parts:
        for name, g in part.grads.items():
            total[name] = g.clone() if name not in total else total[name] + g
    return total


def averaged_buffers(
    buffers: Mapping[str, torch.Tensor], parts: Sequence[GradSync]
) -> dict[str, torch.Tensor]:
    """Batch normalisation's running statistics: per floating buffer of ``buffers`` (name -> the stage's
    own), the row-weighted mean of the members' (each normalised only its rows); new tensors. Empty when
    some member sent none or there is one part."""
    if len(parts) < 2 or not all(part.buffers for part in parts):
        return {}
    means: dict[str, torch.Tensor] = {}
    for name, buffer in buffers.items():
        if not buffer.is_floating_point():
            continue
        if any(name not in p.buffers or p.buffers[name].shape != buffer.shape for p in parts):
            continue
        mean = buffer.new_zeros(buffer.shape)
        for p in parts:
            mean += (p.rows[1] - p.rows[0]) / p.total * p.buffers[name]
        means[name] = mean
    return means


def set_buffers(module: torch.nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Replace ``module``'s buffers by ``values`` (name -> tensor). New tensors, not copied into the old
    ones: batches in flight saved the old ones for their backward pass, and an in-place change would fail
    autograd's version check."""
    for name, value in values.items():
        owner, _, leaf = name.rpartition(".")
        module.get_submodule(owner)._buffers[leaf] = value


__all__ = ["Groups", "averaged_buffers", "cover", "set_buffers", "summed", "whole_update"]
