"""Split-federated training's messages (PiPar, papers/003; ``--mode split-federated``): the server's
rounds and gradients, the devices' activations, updates and profiles (see docs/protocol.md).

Torch is the only heavy import here (as in :mod:`edgeagent.protocol.messages`): the wire codec loads this
module by its name in the registry (:data:`edgeagent.mode_names.MODES`) to decode these kinds, without
the mode's central or worker half."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from edgeagent.compression.base import Compressed
from edgeagent.errors import ProtocolError
from edgeagent.protocol.messages import Kind, Message


class SplitFedKind(Kind):
    """The kinds of split-federated training's messages (their wire names, unchanged since they were
    part of :class:`~edgeagent.protocol.messages.MessageKind`)."""

    SPLIT_ROUND = "split_round"
    SPLIT_ACTIVATION = "split_activation"
    SPLIT_GRADIENT = "split_gradient"
    SPLIT_UPDATE = "split_update"
    SPLIT_PROFILE = "split_profile"


@dataclasses.dataclass(frozen=True)
class SplitRound(Message):
    """Server -> device (its ``control`` topic): epoch ``epoch`` starts from the global model's layers
    ``[0, split)`` (``tensors``, keys ``<layer>.<name>``); train them on ``parallel`` mini-batches of
    ``batch_size // parallel`` rows per iteration. ``split`` equal to the model's depth is FL: the whole
    model on the device, nothing sent until the upload."""

    KIND = SplitFedKind.SPLIT_ROUND
    run_id: str
    epoch: int
    split: int
    parallel: int
    batch_size: int
    tensors: dict[str, torch.Tensor]
    checksum: str = ""  # SHA-256 over ``tensors`` (the device echoes it in its update)
    forward_bits: int = 32  # the activations' k-bit quantizer (AccEPT's codecs; 32: none)
    # > 0: a trial of the exhaustive search (papers/003 Sec. 5.4): only the first ``iterations`` iterations,
    # timed and then discarded; 0: the whole shard. A trial's ``epoch`` is negative (-1 - trial number).
    iterations: int = 0
    # N of each iteration from the first (ours's trial of N in the first epoch); later ones use ``parallel``
    schedule: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        sizes = [self.parallel, *self.schedule]
        if self.split < 1 or min(sizes) < 1 or self.batch_size < max(sizes) or self.iterations < 0:
            raise ProtocolError(
                f"split round of epoch {self.epoch}: split {self.split} and parallel {self.parallel} "
                f"(schedule {self.schedule}) must be >= 1, batch size {self.batch_size} >= each of them "
                f"and iterations {self.iterations} >= 0"
            )

    def parallel_at(self, iteration: int) -> int:
        """N of iteration ``iteration``: the schedule's while it lasts, then ``parallel``."""
        return scheduled_parallel(self.schedule, self.parallel, iteration)


def scheduled_parallel(schedule: Sequence[int], parallel: int, iteration: int) -> int:
    """N of iteration ``iteration`` of a round with this ``schedule`` and ``parallel`` (the server reads it
    for an activation's iteration number, which may be anything a device sent)."""
    return schedule[iteration] if 0 <= iteration < len(schedule) else parallel


@dataclasses.dataclass(frozen=True)
class SplitActivation(Message):
    """Device -> server (``device/<id>/split-act``): the output of layer ``split - 1`` for mini-batch
    ``micro`` of iteration ``iteration``, with its labels. Never the raw inputs: ``split >= 1``."""

    KIND = SplitFedKind.SPLIT_ACTIVATION
    run_id: str
    epoch: int
    iteration: int
    micro: int
    x: torch.Tensor | Compressed
    y: torch.Tensor


@dataclasses.dataclass(frozen=True)
class SplitGradient(Message):
    """Server -> device (``device/<id>/split-grad``): the gradient of the loss w.r.t. that activation,
    already scaled by ``1 / parallel`` (the device sums a whole iteration's and updates once)."""

    KIND = SplitFedKind.SPLIT_GRADIENT
    run_id: str
    epoch: int
    iteration: int
    micro: int
    g: torch.Tensor | Compressed  # raw, or 8-bit stochastic quantization when the activations are compressed
    loss: float
    correct: int = 0


@dataclasses.dataclass(frozen=True)
class SplitUpdate(Message):
    """Device -> server (its ``reply`` topic) at the end of its epoch: its layers ``[0, split)`` after
    training on ``samples`` rows of its own data (FedAvg's weight, eq. 3), and what the epoch cost it."""

    KIND = SplitFedKind.SPLIT_UPDATE
    run_id: str
    epoch: int
    device_id: str
    samples: int
    iterations: int
    tensors: dict[str, torch.Tensor]
    base_checksum: str = ""  # the ``SplitRound.checksum`` it started from
    loss_sum: float = 0.0  # FL (the whole model here): training loss over the epoch's mini-batches
    correct: int = 0
    compute_seconds: float = 0.0
    idle_seconds: float = 0.0  # waiting for gradients
    train_seconds: float = 0.0  # wall seconds from the round's weights in to its last update (no exchange)
    iteration_seconds: list[float] = dataclasses.field(default_factory=list)  # each, first forward to update


@dataclasses.dataclass(frozen=True)
class SplitProfile(Message):
    """Device -> server (its ``reply`` topic): PiPar's profiling phase (Sec. 3.3.1) on this device, a few
    training iterations of the whole model at the run's batch size: every layer's forward and backward
    seconds (its emulated slowdown included), and its links as emulated here (0: not emulated)."""

    KIND = SplitFedKind.SPLIT_PROFILE
    run_id: str
    device_id: str
    fwd: list[float]
    bwd: list[float]
    samples: int
    up_bps: float = 0.0  # measured along the real path to the server (probes); 0: not measured
    down_bps: float = 0.0  # the emulated downlink (--down-mbps); 0: none
    seconds: float = 0.0  # what profiling took here
    latency: float = 0.0  # seconds per message to the server, measured with the bandwidth
    fwd_fixed: list[float] = dataclasses.field(default_factory=list)  # per-call parts of ``fwd`` ([]: 0)
    bwd_fixed: list[float] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        values = [*self.fwd, *self.bwd, self.up_bps, self.down_bps, self.seconds, self.latency]
        fixed_ok = all(len(f) in (0, len(self.fwd)) for f in (self.fwd_fixed, self.bwd_fixed))
        if len(self.fwd) != len(self.bwd) or not self.fwd or not fixed_ok or any(not v >= 0 for v in values):
            raise ProtocolError(
                f"split profile of {self.device_id}: {len(self.fwd)} forward and "
                f"{len(self.bwd)} backward times, all >= 0, at least one layer"
            )


# What the wire codec decodes for this mode (the registry names this module).
MESSAGES: tuple[type[Message], ...] = (SplitRound, SplitActivation, SplitGradient, SplitUpdate, SplitProfile)

__all__ = [
    "MESSAGES",
    "SplitActivation",
    "SplitFedKind",
    "SplitGradient",
    "SplitProfile",
    "SplitRound",
    "SplitUpdate",
    "scheduled_parallel",
]
