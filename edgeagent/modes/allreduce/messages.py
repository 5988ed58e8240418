"""Data-parallel training's messages (``--mode allreduce``): the collectives' messages on the links and the
central node's steps (see docs/protocol.md).

Torch is the only heavy import here (as in :mod:`edgeagent.protocol.messages`): the wire codec loads this
module by its name in the registry (:data:`edgeagent.mode_names.MODES`) to decode these kinds, without
the mode's central or worker half."""

from __future__ import annotations

import dataclasses

import torch

from edgeagent.compression.base import Compressed
from edgeagent.errors import ProtocolError
from edgeagent.protocol.messages import Kind, Message


class AllreduceKind(Kind):
    """The kinds of data-parallel training's messages (their wire names, unchanged since they were part
    of :class:`~edgeagent.protocol.messages.MessageKind`)."""

    ALLREDUCE = "allreduce"
    ALLREDUCE_STEP = "allreduce_step"
    ALLREDUCE_DONE = "allreduce_done"


MAX_CHUNKS = 1024
"""Chunks at most of one vector (:data:`edgeagent.allreduce.chunks.MAX_CHUNKS`; torch-only imports here)."""

MAX_NOTES = 64
"""Metadata notes at most on one link message (:data:`edgeagent.allreduce.bundle.MAX_NOTES`)."""

MAX_ALLREDUCE_MEMBERS = 4096
"""Ranks at most in one allreduce step (checked on decode: a contributor list cannot be made huge)."""


def _check_rank(value: int, what: str) -> None:
    if not -1 <= value < MAX_ALLREDUCE_MEMBERS:
        raise ProtocolError(f"{what} {value} is not a rank (-1 or 0..{MAX_ALLREDUCE_MEMBERS - 1})")


@dataclasses.dataclass(frozen=True)
class AllreduceMsg(Message):
    """Device -> device on ``link/<from>/<to>``: one message of a collective
    (:class:`edgeagent.allreduce.base.CollectiveMsg`; -1 stands for None in ``origin`` and ``target``).

    ``attempt`` tells a step run again over other members (a device died) from the first try; ``ts`` and
    ``echo`` are the sender's clock and the last ``ts`` it received from the receiver, ``echo_delay`` how
    long it held that one: the receiver's round trip on this link is ``now - echo - echo_delay`` (TCP's
    timestamps option, RFC 7323), what adaptive timeouts are made of. ``chunk`` of ``chunks``: which part
    of the vector ``data`` is (the ft-tree exchanges its data by chunks, :mod:`edgeagent.allreduce.chunks`).
    ``notes`` and ``note_targets`` (-1: None): the kinds and targets of metadata messages of the same step
    and sender folded into this one (:mod:`edgeagent.allreduce.bundle`), handled after it, in order.
    """

    KIND = AllreduceKind.ALLREDUCE
    run_id: str
    step: int
    attempt: int
    kind: str
    sender: int
    origin: int = -1
    target: int = -1
    contributors: list[int] = dataclasses.field(default_factory=list)
    data: torch.Tensor | Compressed | None = None
    ts: float = 0.0
    echo: float = -1.0  # -1: nothing to echo yet
    echo_delay: float = 0.0
    chunk: int = 0  # the ft-tree's data by chunks: which chunk of the vector ``data`` is
    chunks: int = 1  # of how many (1: the whole vector)
    notes: list[str] = dataclasses.field(default_factory=list)  # kinds of metadata folded in
    note_targets: list[int] = dataclasses.field(default_factory=list)  # their targets (-1: None)

    def __post_init__(self) -> None:
        if self.step < 0 or self.attempt < 0:
            raise ProtocolError(f"allreduce message with step {self.step}, attempt {self.attempt}")
        if not (0 <= self.chunk < MAX_CHUNKS and 1 <= self.chunks <= MAX_CHUNKS):
            # chunk < chunks is the collective's check (a message it drops and counts as rejected)
            raise ProtocolError(f"allreduce chunk {self.chunk} of {self.chunks}: at most {MAX_CHUNKS} chunks")
        if not 1 <= len(self.kind) <= 32:
            raise ProtocolError(f"allreduce message kind of {len(self.kind)} characters (1-32)")
        for what, rank in (("sender", self.sender), ("origin", self.origin), ("target", self.target)):
            _check_rank(rank, f"allreduce {what}")
        if self.sender < 0:
            raise ProtocolError("allreduce message without a sender rank")
        if len(self.contributors) > MAX_ALLREDUCE_MEMBERS:
            raise ProtocolError(f"allreduce message names {len(self.contributors)} contributors")
        if len(self.notes) > MAX_NOTES or len(self.note_targets) != len(self.notes):
            raise ProtocolError(
                f"allreduce message with {len(self.notes)} notes and {len(self.note_targets)} note targets "
                f"(at most {MAX_NOTES}, one target each)"
            )
        for kind, target in zip(self.notes, self.note_targets, strict=True):
            if not 1 <= len(kind) <= 32:
                raise ProtocolError(f"allreduce note kind of {len(kind)} characters (1-32)")
            _check_rank(target, "allreduce note target")
        for rank in self.contributors:
            _check_rank(rank, "allreduce contributor")
        if isinstance(self.data, torch.Tensor) and self.data.dtype != torch.float32:
            raise ProtocolError(f"allreduce data must be float32, got {self.data.dtype}")


@dataclasses.dataclass(frozen=True)
class AllreduceStep(Message):
    """Central -> the run's devices on ``run/commit``: run step ``step`` (try ``attempt``) over
    ``members`` (rank = index). A device applies its previous step's update first, and undoes a step it
    applied when the same step comes again with a higher ``attempt`` (a member died during it).

    ``weights`` (flat, the model's parameters in order): the model to start from (a device that joins,
    the parameter server's current model). ``collect``: after this step, the device of rank 0 sends its
    weights with its ``AllreduceDone`` (the central node evaluates and saves them).
    """

    KIND = AllreduceKind.ALLREDUCE_STEP
    run_id: str
    step: int
    attempt: int
    members: list[str]
    epoch: int = 0
    collect: bool = False
    weights: torch.Tensor | None = None
    weights_step: int = -1  # the step after which ``weights`` were taken (-1: before the first)

    def __post_init__(self) -> None:
        if self.step < 0 or self.attempt < 0 or self.epoch < 0:
            raise ProtocolError(f"allreduce step {self.step}, attempt {self.attempt}, epoch {self.epoch}")
        if not 1 <= len(self.members) <= MAX_ALLREDUCE_MEMBERS or len(set(self.members)) != len(self.members):
            raise ProtocolError(f"allreduce step {self.step}: 1-{MAX_ALLREDUCE_MEMBERS} distinct members")


@dataclasses.dataclass(frozen=True)
class AllreduceDone(Message):
    """Device -> central on its reply topic: step ``step`` is done here. ``digest`` is SHA-256 over the
    weights after the update (all replicas must agree), ``contributors`` the ranks whose gradients the
    averaged one holds, ``collective_seconds`` the allreduce's time here (start to result)."""

    KIND = AllreduceKind.ALLREDUCE_DONE
    run_id: str
    device_id: str
    step: int
    attempt: int
    digest: str
    loss: float
    samples: int
    contributors: list[int]
    compute_seconds: float = 0.0
    collective_seconds: float = 0.0
    dropped: int = 0  # link messages dropped by --fail-link on this device so far
    raw_bytes: int = 0  # --compression: float32 bytes of the gradients it compressed so far
    sent_bytes: int = 0  # and their compressed bytes
    weights: torch.Tensor | None = None  # flat parameters, when the step asked for them (collect)

    def __post_init__(self) -> None:
        if len(self.contributors) > MAX_ALLREDUCE_MEMBERS:
            raise ProtocolError(f"allreduce done names {len(self.contributors)} contributors")


# What the wire codec decodes for this mode (the registry names this module).
MESSAGES: tuple[type[Message], ...] = (AllreduceMsg, AllreduceStep, AllreduceDone)

__all__ = [
    "MAX_ALLREDUCE_MEMBERS",
    "MESSAGES",
    "AllreduceDone",
    "AllreduceKind",
    "AllreduceMsg",
    "AllreduceStep",
]
