"""The sans-I/O contract between the allreduce collectives (pure policy) and the mode that moves their
messages over MQTT (I/O).

A collective is a state machine per device and per step: it is given this device's flat gradient, the
messages that arrive, and the clock; it answers with the messages to send (:class:`Send`) and, once the
step is complete, the averaged gradient. It never sleeps, never reads a clock and never touches a socket,
so the same object runs under the MQTT mode and under the in-memory driver of the unit tests (with
injected link failures). Timeouts are deadlines the driver asks for (:meth:`Collective.next_deadline`)
and reports back (:meth:`Collective.tick`); the timeout's length is the driver's choice per link
(:class:`LinkTimeouts`: the thesis's fixed value, or one derived from measured round trips).

Note: a message's ``kind`` is one of :data:`REDUCE_KINDS` / :data:`BROADCAST_KINDS` (the thesis's five
reduce and three broadcast messages, Algorithms 1 and 2) or a baseline's own kinds; the wire message in
:mod:`edgeagent.protocol` carries it as a string, with ``step``, ``origin`` (whose data), ``target`` (the
node a meta message is about), ``contributors`` (the ranks summed into ``data``: what makes "no
contribution lost or counted twice" checkable) and the ``data`` tensor (absent in metadata messages);
the ft-tree's data messages also carry ``chunk`` of ``chunks`` (:mod:`edgeagent.allreduce.chunks`), and
``notes``: metadata messages to the same device folded into this one by the driver
(:mod:`edgeagent.allreduce.bundle`; the collectives themselves never fill it).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

REDUCE_KINDS = (
    "data_reduce",
    "meta_reduce_sent",
    "meta_reduce_received",
    "meta_reduce_request",
    "data_reduce_request",
)
BROADCAST_KINDS = ("data_bcast", "meta_bcast_received", "meta_bcast_sent")


@dataclasses.dataclass(frozen=True)
class CollectiveMsg:
    """One message of a collective, between two devices (ranks are indices into the step's members)."""

    kind: str
    step: int
    sender: int
    origin: int | None = None  # whose data (a data_reduce_request relays another node's sum)
    target: int | None = None  # the node a metadata message is about
    contributors: tuple[int, ...] = ()  # ranks whose gradients are summed in ``data``
    data: torch.Tensor | None = None  # flat float32; None for metadata
    chunk: int = 0  # which chunk of the vector ``data`` is (the ft-tree's exchange by chunks)
    chunks: int = 1  # of how many (1: the whole vector)
    notes: tuple[tuple[str, int | None], ...] = ()  # (kind, target) of metadata folded in (bundle.py)


@dataclasses.dataclass(frozen=True)
class Send:
    """Send ``msg`` to rank ``to``."""

    to: int
    msg: CollectiveMsg


class LinkTimeouts(Protocol):
    """How long to wait on the link from this device to ``peer`` before the backup path acts."""

    def timeout(self, peer: int) -> float: ...


class Collective(Protocol):
    """One device's part in one allreduce step (see the module doc)."""

    def start(self, grad: torch.Tensor, now: float) -> list[Send]:
        """Begin the step with this device's flat gradient (a sum over its batch, not yet averaged)."""
        ...

    def receive(self, msg: CollectiveMsg, now: float) -> list[Send]:
        """A message for this step arrived."""
        ...

    def tick(self, now: float) -> list[Send]:
        """The clock reached a deadline this collective asked for: act on expired timeouts."""
        ...

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`tick` must be called, or None."""
        ...

    def result(self) -> torch.Tensor | None:
        """The averaged gradient once this device has it (the step is done here), else None."""
        ...

    def done(self) -> bool:
        """Nothing more to send or wait for on this device (the result is known and every backup
        obligation of this step is settled); the driver may then drop the object."""
        ...
