"""The run's commands: central node -> devices on ``run/command``, one class per command.

On the wire a command stays ``{"run_id": ..., "name": NAME, "args": {field: value}}`` (JSON, so users can
send one by hand); :func:`edgeagent.protocol.wire.decode` picks the class by ``name`` from
:data:`COMMAND_TYPES` and checks every argument's type.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Literal

from edgeagent.errors import ProtocolError
from edgeagent.protocol.messages import Message, MessageKind, check_groups, check_model_request


@dataclasses.dataclass(frozen=True)
class Command(Message):
    """Central -> devices: one subclass per command, told apart by ``NAME``.

    On the wire a command stays ``{"run_id": ..., "name": NAME, "args": {field: value}}`` (JSON, so users
    can send one by hand); :func:`decode` picks the subclass by ``name`` and checks every argument's type,
    so a role never sees an unknown command or a missing argument.
    """

    KIND = MessageKind.COMMAND
    ENCODING = "json"
    NAME: ClassVar[str] = ""
    run_id: str


@dataclasses.dataclass(frozen=True)
class Stop(Command):
    """The run is over: leave it."""

    NAME = "stop"


@dataclasses.dataclass(frozen=True)
class Collect(Command):
    """Send the stage's weights to the central node (the trained model)."""

    NAME = "collect"


@dataclasses.dataclass(frozen=True)
class Ping(Command):
    """Say you are alive and which weight versions you hold (a recovery's probe)."""

    NAME = "ping"


ResendKind = Literal["gradients", "activations"]
"""``Resend.kind``: what the neighbour of a dead stage sends again."""


@dataclasses.dataclass(frozen=True)
class Resend(Command):
    """For a recovery without a rollback, which replays a dead stage's lost batches from what its neighbours
    sent it (modes/pipeline/central/catchup.py). ``kind`` ``gradients``: ``device``, the stage after the
    dead one, drops the dead stage's outputs still queued, waits until every batch it sent on came back,
    sends again the gradients it sent for batches ``since`` on (plan ``plan_id``) and says
    ``Ready(phase="resent")`` with its version. ``activations``: ``device``, the stage before the dead one,
    sends again the activations it sent from batch ``since`` on, says ``Ready(phase="resent")`` with its
    version and ``sent`` (one past the newest batch it sent), and takes the dead stage's gradients from the
    central node until its next plan (the central node sends those the replay yields)."""

    NAME = "resend"
    device: str
    plan_id: int
    since: int
    kind: ResendKind = "gradients"


@dataclasses.dataclass(frozen=True)
class MeasureLink(Command):
    """``source`` measures its link to ``target`` through the broker and reports it."""

    NAME = "probe"
    source: str
    target: str


@dataclasses.dataclass(frozen=True)
class Emulate(Command):
    """``device`` emulates a device ``slowdown`` times slower from now on."""

    NAME = "emulate"
    device: str
    slowdown: float

    def __post_init__(self) -> None:
        if self.slowdown < 1:
            raise ProtocolError(f"emulate needs slowdown >= 1, got {self.slowdown}")


@dataclasses.dataclass(frozen=True)
class Characterise(Command):
    """``device`` measures its ``h`` for ``model`` (a ``ModelSpec.to_dict()``) at ``batch_size`` again,
    whatever it measured before, and announces it (papers/004 Sec. 3.2: the central node asks when the
    times it sees drift from the prediction beyond its tolerance)."""

    NAME = "characterise"
    device: str
    model: dict[str, Any]
    batch_size: int

    def __post_init__(self) -> None:
        check_model_request(self.model, self.batch_size, f"characterise {self.device!r}", optional=False)


@dataclasses.dataclass(frozen=True)
class SetCompression(Command):
    """Bit widths per stage for plan ``plan_id``: a worker ignores another plan's, and leaves the run when
    a newer plan goes on without it."""

    NAME = "compression"
    plan_id: int
    forward: list[int]
    backward: list[int]

    def __post_init__(self) -> None:
        if len(self.forward) != len(self.backward):
            raise ProtocolError(
                f"compression needs bits per stage both ways: {len(self.forward)} forward, "
                f"{len(self.backward)} backward"
            )


@dataclasses.dataclass(frozen=True)
class Reshare(Command):
    """Inside plan ``plan_id``, the members of some stages changed (a replica died, say): from now on the
    stages are held by ``groups`` (primaries first, ``worker_list``) with ``shares`` of every batch's rows.
    Batches not yet updated on a changed stage are computed again there under the new shares."""

    NAME = "reshare"
    plan_id: int
    share_version: int
    worker_list: list[str]
    groups: list[list[str]]
    shares: list[list[float]]

    def __post_init__(self) -> None:
        check_groups(self.groups, self.shares, self.worker_list)
        if not self.groups:
            raise ProtocolError("reshare names no groups")


@dataclasses.dataclass(frozen=True)
class SetReplication(Command):
    """Inside plan ``plan_id``, from ``from_batch`` batches done on, chain replicas every ``chain_every``
    batches (counted from ``from_batch``): ResPipe's period T in seconds at the rate the central node
    measured (:func:`edgeagent.replication.period.retune`)."""

    NAME = "replication"
    plan_id: int
    from_batch: int
    chain_every: int

    def __post_init__(self) -> None:
        if self.from_batch < 0 or self.chain_every < 1:
            raise ProtocolError(
                f"replication needs from_batch >= 0 and chain_every >= 1, got {self.from_batch} and "
                f"{self.chain_every}"
            )


@dataclasses.dataclass(frozen=True)
class PaceReplicas(Command):
    """Replicas take at most ``share`` of a slow uplink, in its idle time: ``uplinks`` names the devices
    whose real uplink the central node measured below ``replica_pace_mbps``, with that measure (Mbit/s);
    every worker of the run keeps the snapshots paced replicas need (they arrive later)."""

    NAME = "pace"
    share: float
    uplinks: dict[str, float]

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise ProtocolError(f"pace needs 0 < share <= 1, got {self.share}")
        bad = {d: v for d, v in self.uplinks.items() if not math.isfinite(v) or v <= 0}
        if bad:
            raise ProtocolError(f"pace needs uplinks > 0 Mbit/s, got {bad}")


COMMAND_TYPES: dict[str, type[Command]] = {
    cls.NAME: cls
    for cls in (
        Stop,
        Collect,
        Ping,
        Resend,
        MeasureLink,
        Emulate,
        Characterise,
        SetCompression,
        Reshare,
        SetReplication,
        PaceReplicas,
    )
}
