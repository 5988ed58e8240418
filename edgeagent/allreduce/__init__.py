"""Data-parallel training's collectives (``--mode allreduce``): the thesis's fault-tolerant tree allreduce
(papers/001) and its baselines, as pure state machines (:mod:`edgeagent.allreduce.base`).

``make_collective`` builds one device's part of one step by name: ``ft-tree`` (the thesis's algorithm
with our proactive broadcast rule), ``ft-tree-thesis`` (Algorithms 1 and 2 as written), ``tree`` and
``ring``. The parameter-server baselines (``ps-sync``, ``ps-async``) run on the central node and are not
collectives.
"""

from __future__ import annotations

from edgeagent.allreduce.base import Collective, LinkTimeouts
from edgeagent.allreduce.ft_tree import FtTreeAllreduce
from edgeagent.allreduce.ring import RingAllreduce
from edgeagent.allreduce.tree import TreeAllreduce
from edgeagent.errors import ConfigError

COLLECTIVES = ("ft-tree", "ft-tree-thesis", "tree", "ring")


def make_collective(name: str, rank: int, size: int, step: int, timeouts: LinkTimeouts) -> Collective:
    """One device's part (``rank`` of ``size``) in allreduce ``step`` with the collective ``name``."""
    if name == "ft-tree":
        return FtTreeAllreduce(rank, size, step, timeouts, variant="proactive")
    if name == "ft-tree-thesis":
        return FtTreeAllreduce(rank, size, step, timeouts, variant="thesis")
    if name == "tree":
        return TreeAllreduce(rank, size, step, timeouts)
    if name == "ring":
        return RingAllreduce(rank, size, step, timeouts)
    raise ConfigError(f"unknown collective {name!r}: choose one of {', '.join(COLLECTIVES)}")


__all__ = ["COLLECTIVES", "make_collective"]
