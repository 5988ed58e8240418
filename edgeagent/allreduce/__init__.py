"""Data-parallel training's collectives (``--mode allreduce``): the thesis's fault-tolerant tree allreduce
(papers/001) and its baselines, as pure state machines (:mod:`edgeagent.allreduce.base`).

``make_collective`` builds one device's part of one step by name: ``ft-tree`` (the thesis's algorithm
with our proactive broadcast rule, its data exchanged by chunks of
:data:`~edgeagent.allreduce.chunks.CHUNK_FLOATS`, pipelined down the tree), ``ft-tree-thesis``
(Algorithms 1 and 2 as written, one message per sum and per mean: the paper's exchange), ``tree`` and
``ring``. The parameter-server baselines (``ps-sync``, ``ps-async``) run on the central node and are not
collectives.

Note for the mode that drives them (what :mod:`edgeagent.allreduce.base` does not say):
- ``start`` takes this device's flat gradient (any float dtype; kept as flat float32); ``result`` is the
  **mean** over the step's members, flat float32 (reshape it yourself).
- Messages of the step that arrive before ``start`` are kept and handled at ``start``; other steps'
  are ignored; inconsistent ones (wrong shape, bad contributors, unknown kind) are dropped and counted in
  the collective's ``rejected`` attribute, never raised.
- Keep delivering a step's messages and ticks until ``done()`` (a backup node may still owe a
  neighbour the mean after it has its own), even while the next step runs.
- Bundles: with a collective of :data:`BUNDLED`, pass each batch of sends through
  :func:`~edgeagent.allreduce.bundle.bundle` and each received message through
  :func:`~edgeagent.allreduce.bundle.unbundle` (the collectives never see a note).
- Kinds on the wire: the ft-tree uses the eight of ``REDUCE_KINDS``/``BROADCAST_KINDS``; ``tree`` and
  ``ring`` use ``data_reduce`` and ``data_bcast`` only; the ring puts the **chunk index in ``target``**.
- Every collective here has ``contributors()`` (the ranks in the mean, for checks); the mean is
  computed once (by the root, or per chunk on the ring) and copied, so all replicas get the same bits;
  :class:`~edgeagent.allreduce.sim.FixedTimeouts` is the thesis's fixed timeout;
  :mod:`edgeagent.allreduce.topology` has the tree, the ring order and ``rebuild`` (live members to
  ranks) for node failures.
"""

from __future__ import annotations

from edgeagent.allreduce.base import Collective, LinkTimeouts
from edgeagent.allreduce.chunks import CHUNK_FLOATS
from edgeagent.allreduce.ft_tree import FtTreeAllreduce
from edgeagent.allreduce.ring import RingAllreduce
from edgeagent.allreduce.tree import TreeAllreduce
from edgeagent.errors import ConfigError

COLLECTIVES = ("ft-tree", "ft-tree-thesis", "tree", "ring")
BUNDLED = frozenset({"ft-tree"})
"""The collectives whose metadata the driver folds into fewer messages (:mod:`edgeagent.allreduce.bundle`);
``ft-tree-thesis`` stays the paper's exchange, one message per metadata message."""


def make_collective(name: str, rank: int, size: int, step: int, timeouts: LinkTimeouts) -> Collective:
    """One device's part (``rank`` of ``size``) in allreduce ``step`` with the collective ``name``."""
    if name == "ft-tree":
        return FtTreeAllreduce(rank, size, step, timeouts, variant="proactive", chunk_floats=CHUNK_FLOATS)
    if name == "ft-tree-thesis":
        return FtTreeAllreduce(rank, size, step, timeouts, variant="thesis")
    if name == "tree":
        return TreeAllreduce(rank, size, step, timeouts)
    if name == "ring":
        return RingAllreduce(rank, size, step, timeouts)
    raise ConfigError(f"unknown collective {name!r}: choose one of {', '.join(COLLECTIVES)}")


__all__ = ["BUNDLED", "COLLECTIVES", "make_collective"]
