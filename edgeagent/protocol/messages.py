"""Typed messages and their envelope.

Every payload is an envelope ``{"v": FORMAT_VERSION, "k": kind, "s": sender, "b": body}``. Messages
that carry tensors (the data plane, assignments, weights) are CBOR; status, heartbeats, metrics,
events and commands are JSON so that ``mosquitto_sub -v -t 'edgeagent/#'`` shows them readably.
Tensors are RFC 8746 typed arrays (see :mod:`edgeagent.protocol.tensors`); nothing is pickled.

Each message kind is a frozen dataclass; :func:`decode` checks every field's type, so a role never
sees a half-valid message. Fields with a fixed set of values are ``Literal`` types, defined once here
(:data:`StatusState`, :data:`ActivationMode`, :data:`ReadyPhase`, :data:`WeightsPurpose`,
:data:`ErrorCode`) for the roles and the monitor to use; :func:`decode` rejects any other value,
naming the field and the values it allows. A new value (a new error code) is added to its alias, and a
receiver that does not know it yet drops the message. ``Assign.mode`` is the exception: a worker that
does not know the training mode an assignment names answers with an ``assign`` error, so that the
central node stops at once with the reason instead of waiting for a stage that never comes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable
from enum import Enum
from typing import Any, ClassVar, Literal, Union

import cbor2
import torch

from edgeagent.compression.base import Compressed, from_wire, to_wire
from edgeagent.errors import ProtocolError
from edgeagent.pipeline.stage import TrainOptions
from edgeagent.protocol.tensors import decode_tensor, encode_tensor

FORMAT_VERSION = 1
MAX_DECODE_BYTES = 256 * 1024 * 1024


class MessageKind(str, Enum):
    DISCOVER = "discover"
    ANNOUNCE = "announce"
    STATUS = "status"
    HEARTBEAT = "heartbeat"
    ASSIGN = "assign"
    READY = "ready"
    ACTIVATION = "activation"
    GRADIENT = "gradient"
    EVAL_RESULT = "eval_result"
    COMMAND = "command"
    WEIGHTS = "weights"
    COMMIT = "commit"
    METRICS = "metrics"
    EVENT = "event"
    ERROR = "error"
    PROBE = "probe"
    PROFILE = "profile"
    LINK_REPORT = "link_report"
    REPARTITION = "repartition"
    FETCH = "fetch"
    GRAD_SYNC = "grad_sync"


Encoding = Literal["cbor", "json"]

# Fields with a fixed set of values. ``typing.get_args(StatusState)`` lists the values (the decoder's
# check, documentation); extending an alias extends what every receiver accepts.
StatusState = Literal["online", "idle", "training", "error", "left", "offline"]
"""``Status.state``: ``left`` is a clean exit, ``offline`` the last will."""
ActivationMode = Literal["train", "eval"]
"""``Activation.mode``: a training batch (its gradient comes back) or an evaluation batch."""
ReadyPhase = Literal["built", "fetched", "alive"]
"""``Ready.phase``: ``fetched``: has every layer of a new plan; ``built``: the stage runs; ``alive``: the
answer to a ping (with the weight versions it holds)."""
WeightsPurpose = Literal["collect", "chain", "global", "redistribute"]
"""``Weights.purpose``: the answer to ``collect``, a chain or global replica, or layers moving owner."""
ErrorCode = Literal["message", "compute", "busy", "assign", "repartition", "profile", "command", "probe"]
"""``ErrorReport.code``: what a role rejected (a message it could not take, a failed computation, an
assignment while busy or one it cannot build, a re-partition, a profile, a command, a link probe)."""


@dataclasses.dataclass(frozen=True)
class Message:
    """Base of all messages. Subclasses set ``KIND`` and ``ENCODING``."""

    KIND: ClassVar[MessageKind]
    ENCODING: ClassVar[Encoding] = "cbor"


# ---------------------------------------------------------------------------------------------
# Discovery and liveness (JSON)


@dataclasses.dataclass(frozen=True)
class Discover(Message):
    """The central node asks every device of the cluster to announce itself."""

    KIND = MessageKind.DISCOVER
    ENCODING = "json"
    run_id: str


@dataclasses.dataclass(frozen=True)
class Announce(Message):
    """A worker says it is available (at start-up and in answer to :class:`Discover`)."""

    KIND = MessageKind.ANNOUNCE
    ENCODING = "json"
    device_id: str
    busy_with: str = ""  # the run id it is training in, "" when idle
    threads: int = 1
    slowdown: float = 1.0
    software: str = ""
    profile_hash: str = ""
    memory_limit: float = 0.0  # bytes the stage may use; 0 = no limit


@dataclasses.dataclass(frozen=True)
class Status(Message):
    """Retained per-device status; the last will publishes ``state="offline"``."""

    KIND = MessageKind.STATUS
    ENCODING = "json"
    device_id: str
    state: StatusState
    run_id: str = ""
    stage: int = -1
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class Heartbeat(Message):
    KIND = MessageKind.HEARTBEAT
    ENCODING = "json"
    device_id: str
    seq: int
    run_id: str = ""
    stage: int = -1
    interval: float = 1.0


# ---------------------------------------------------------------------------------------------
# Set-up (CBOR)


@dataclasses.dataclass(frozen=True)
class Assign(Message):
    """Central -> worker: everything a worker needs to build its stage (paper Table I and more)."""

    KIND = MessageKind.ASSIGN
    run_id: str
    plan_id: int
    worker_list: list[str]  # device ids in pipeline order; index 0 is the central node
    points: list[int]  # partition points: stage i owns layers [points[i], points[i+1])
    model: dict[str, Any]  # ModelSpec.to_dict()
    seed: int
    # Table I state variables.
    committed_forward_id: int
    committed_backward_id: int
    status: int
    options: TrainOptions  # the optimizer settings every stage shares (learning rate of Table I and more)
    epochs: int
    batches_per_epoch: int
    in_flight: int = 4
    weights: dict[str, torch.Tensor] | None = None  # pre-trained weights (continuous learning)
    momentum_buffers: dict[str, torch.Tensor] | None = None  # optimizer state to resume with (checkpoint)
    # Replication (Sec. III-E): chain to the next ``replicas`` stages every ``chain_every`` batches,
    # global (to the central node) every ``global_every`` batches; 0 turns one off.
    chain_every: int = 50
    global_every: int = 100
    replicas: int = 1
    metrics_interval: float = 1.0  # seconds between metrics messages of every device of the run
    # One sample of every layer's output (batch dimension left out): a stage starting at layer j > 0
    # takes layer_shapes[j - 1]; activations that do not fit are dropped on receipt. Empty: unchecked.
    layer_shapes: list[list[int]] = dataclasses.field(default_factory=list)
    layer_dtypes: list[str] = dataclasses.field(default_factory=list)  # "float32", ... per layer output
    # The training mode whose worker session takes this run (edgeagent.modes.MODES). Not an enumeration on
    # the wire: a worker that lacks the mode says so (an "assign" error) rather than dropping the message.
    mode: str = "pipeline"
    # Hybrid stages: every device of every stage, the stage's primary (``worker_list[k]``) first, and each
    # member's share of every batch's rows; empty = one device per stage (``worker_list``).
    groups: list[list[str]] = dataclasses.field(default_factory=list)
    shares: list[list[float]] = dataclasses.field(default_factory=list)
    share_version: int = 0  # bumped when a stage's members change inside a plan (failover)

    def __post_init__(self) -> None:
        _check_groups(self.groups, self.shares, self.worker_list)


def _check_groups(groups: list[list[str]], shares: list[list[float]], worker_list: list[str]) -> None:
    """``groups`` and ``shares`` describe the same stages as ``worker_list``, primaries first."""
    if not groups and not shares:
        return
    if len(groups) != len(worker_list) or len(shares) != len(worker_list):
        raise ProtocolError(
            f"{len(groups)} groups and {len(shares)} share lists for {len(worker_list)} stages"
        )
    for k, (group, share) in enumerate(zip(groups, shares, strict=True)):
        unique = len(set(group)) == len(group)
        if not group or group[0] != worker_list[k] or len(group) != len(share) or not unique:
            raise ProtocolError(
                f"stage {k}: group {group} with shares {share} must start with its primary "
                f"{worker_list[k]!r}, name each device once and give each a share"
            )
        if any(not 0 < x <= 1 for x in share) or abs(sum(share) - 1) > 1e-6:
            raise ProtocolError(f"stage {k}: shares {share} must be in (0, 1] and sum to 1")


def _check_rows(rows: list[int], total: int, what: str) -> None:
    """``rows`` is empty (the whole batch) or ``[lo, hi]`` with ``0 <= lo < hi <= total``."""
    if rows and (len(rows) != 2 or not 0 <= rows[0] < rows[1] <= total):
        raise ProtocolError(f"{what}: rows {rows} must be [lo, hi] with 0 <= lo < hi <= total {total}")


@dataclasses.dataclass(frozen=True)
class Ready(Message):
    """Worker -> central: the stage is built and subscribed."""

    KIND = MessageKind.READY
    run_id: str
    plan_id: int
    device_id: str
    stage: int
    parameters: int
    phase: ReadyPhase = "built"
    # For "alive": weight versions this device can serve, per device whose weights they are.
    holdings: dict[str, list[int]] = dataclasses.field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Data plane (CBOR)


@dataclasses.dataclass(frozen=True)
class Activation(Message):
    """Output of stage ``stage`` for one batch; ``version`` is the weight version (vertical sync)."""

    KIND = MessageKind.ACTIVATION
    run_id: str
    plan_id: int
    stage: int
    batch_id: int
    version: int
    mode: ActivationMode
    # The stage's output: a raw tensor, or, when the link compresses activations, the codec's payload
    # (``edgeagent.compression.Compressed``: codec id, shape, dtype, parameters, packed bits), checked on
    # decode; the receiving stage's runner restores it (``StageRunner.take_activation``).
    x: torch.Tensor | Compressed
    y: torch.Tensor  # labels travel with the batch so the last stage can compute the loss
    # Hybrid stages: the rows ``[lo, hi)`` of the batch's ``total`` rows this message carries (``x`` and
    # ``y`` hold only those); empty = the whole batch.
    rows: list[int] = dataclasses.field(default_factory=list)
    total: int = 0

    def __post_init__(self) -> None:
        _check_rows(self.rows, self.total, f"activation of batch {self.batch_id}")

    @property
    def tensor(self) -> torch.Tensor:
        """``x`` as a tensor; a compressed ``x`` must be restored first (``StageRunner.take_activation``)."""
        return _raw(self.x, f"activation of batch {self.batch_id}")


@dataclasses.dataclass(frozen=True)
class Gradient(Message):
    """Gradient of the loss w.r.t. the input of stage ``stage + 1``, sent by that stage."""

    KIND = MessageKind.GRADIENT
    run_id: str
    plan_id: int
    stage: int
    batch_id: int
    g: torch.Tensor | Compressed  # raw or compressed, as ``Activation.x``
    loss: float  # the last stage's loss for this batch, passed down to the central node
    correct: int = 0  # training predictions that were right (for training accuracy)
    # Average compute seconds per batch of each stage from this one to the last (capacity estimation).
    stage_times: list[float] = dataclasses.field(default_factory=list)
    # Hybrid stages: the rows ``[lo, hi)`` of ``total`` this gradient covers (empty = all), the loss and
    # correctness of each of those rows (``loss`` and ``correct`` are then their sums), and every device's
    # seconds per whole batch from this stage to the last (its time over its share of the rows).
    rows: list[int] = dataclasses.field(default_factory=list)
    total: int = 0
    row_loss: list[float] = dataclasses.field(default_factory=list)
    row_correct: list[int] = dataclasses.field(default_factory=list)
    device_times: dict[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        what = f"gradient of batch {self.batch_id}"
        _check_rows(self.rows, self.total, what)
        span = self.rows[1] - self.rows[0] if self.rows else 0
        if self.rows and (len(self.row_loss) != span or len(self.row_correct) != span):
            raise ProtocolError(
                f"{what}: {len(self.row_loss)} row losses and {len(self.row_correct)} row results "
                f"for {span} rows"
            )

    @property
    def tensor(self) -> torch.Tensor:
        """``g`` as a tensor; a compressed ``g`` must be restored first (``StageRunner.take_gradient``)."""
        return _raw(self.g, f"gradient of batch {self.batch_id}")


def _raw(value: torch.Tensor | Compressed, what: str) -> torch.Tensor:
    if isinstance(value, Compressed):
        raise ProtocolError(f"{what} is still compressed ({value.codec}): restore it with its stage's runner")
    return value


@dataclasses.dataclass(frozen=True)
class EvalResult(Message):
    KIND = MessageKind.EVAL_RESULT
    run_id: str
    plan_id: int
    batch_id: int
    correct: int
    count: int
    loss_sum: float
    rows: list[int] = dataclasses.field(default_factory=list)  # hybrid stages: the rows counted here
    total: int = 0

    def __post_init__(self) -> None:
        _check_rows(self.rows, self.total, f"evaluation result of batch {self.batch_id}")


@dataclasses.dataclass(frozen=True)
class GradSync(Message):
    """A member of a replicated stage -> the stage's other members: its parameter gradients of one batch
    (over its rows, already weighted by rows / total), summed by every member before the update."""

    KIND = MessageKind.GRAD_SYNC
    run_id: str
    plan_id: int
    stage: int
    batch_id: int
    share_version: int
    device_id: str
    rows: list[int]
    total: int
    grads: dict[str, torch.Tensor]
    # The member's floating-point buffers (batch normalisation's running statistics): every member takes
    # their row-weighted mean with the update, so the members evaluate alike.
    buffers: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.rows:
            raise ProtocolError(f"gradient sync of batch {self.batch_id} names no rows")
        _check_rows(self.rows, self.total, f"gradient sync of batch {self.batch_id}")


# ---------------------------------------------------------------------------------------------
# Control


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
        _check_groups(self.groups, self.shares, self.worker_list)
        if not self.groups:
            raise ProtocolError("reshare names no groups")


COMMAND_TYPES: dict[str, type[Command]] = {
    cls.NAME: cls for cls in (Stop, Collect, Ping, MeasureLink, Emulate, SetCompression, Reshare)
}


@dataclasses.dataclass(frozen=True)
class Weights(Message):
    """A stage's weights: an answer to ``collect``, a replica, or layers moving to a new owner."""

    KIND = MessageKind.WEIGHTS
    run_id: str
    device_id: str
    stage: int
    start: int
    end: int
    version: int
    tensors: dict[str, torch.Tensor]
    purpose: WeightsPurpose = "collect"
    optimizer: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # momentum buffers
    plan_id: int = -1
    recipient: str = ""  # for "redistribute": the device that asked for these layers
    # The layers these tensors belong to; a layer without parameters or buffers (pooling, flatten)
    # has no tensors but still counts as delivered.
    layers: list[int] = dataclasses.field(default_factory=list)
    of_device: str = ""  # whose weights these are, when a holder serves another device's replica
    checksum: str = ""  # SHA-256 over the tensors (replicas): a replica counts only when it verifies


@dataclasses.dataclass(frozen=True)
class Commit(Message):
    KIND = MessageKind.COMMIT
    run_id: str
    plan_id: int


@dataclasses.dataclass(frozen=True)
class Metrics(Message):
    KIND = MessageKind.METRICS
    ENCODING = "json"
    device_id: str
    values: dict[str, Any]
    run_id: str = ""


@dataclasses.dataclass(frozen=True)
class Event(Message):
    KIND = MessageKind.EVENT
    ENCODING = "json"
    name: str
    run_id: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ErrorReport(Message):
    """A role tells the sender (or the monitor) what it rejected and why."""

    KIND = MessageKind.ERROR
    ENCODING = "json"
    device_id: str
    code: ErrorCode
    reason: str
    run_id: str = ""


@dataclasses.dataclass(frozen=True)
class Profile(Message):
    """Central -> device, retained: the device's settings (``configs/devices/<id>.yaml``)."""

    KIND = MessageKind.PROFILE
    ENCODING = "json"
    device_id: str
    settings: dict[str, Any]
    digest: str


# ---------------------------------------------------------------------------------------------
# Links and re-partitioning (papers/000 Sec. III-B, III-D)


@dataclasses.dataclass(frozen=True)
class Probe(Message):
    """Bandwidth probe along the real path (device -> broker -> device); the target echoes a tiny reply."""

    KIND = MessageKind.PROBE
    source: str
    target: str
    nonce: int
    reply: bool = False
    padding: bytes = b""


@dataclasses.dataclass(frozen=True)
class LinkReport(Message):
    """Measured link from ``source`` to ``target`` (stage k to k+1), sent to the central node."""

    KIND = MessageKind.LINK_REPORT
    run_id: str
    source: str
    target: str
    bandwidth: float  # bytes per second
    latency: float  # seconds per message


@dataclasses.dataclass(frozen=True)
class Repartition(Message):
    """Central -> all: a new split. Each device works out what it lacks and fetches it (Algorithm 1)."""

    KIND = MessageKind.REPARTITION
    run_id: str
    plan_id: int
    points: list[int]
    worker_list: list[str]
    previous_points: list[int]
    previous_workers: list[str]
    version: int  # every stage's weight version after the drain (the committed backward id + 1)
    reason: str = ""
    # Recovery (Sec. III-F): every stage rolls back to the replica of ``version`` and the run replays
    # from there; ``sources[i]`` is the device that serves old stage i's weights at that version.
    recovery: bool = False
    sources: list[str] = dataclasses.field(default_factory=list)
    # Hybrid stages of the new plan (as ``Assign.groups`` and ``Assign.shares``); empty = one per stage.
    groups: list[list[str]] = dataclasses.field(default_factory=list)
    shares: list[list[float]] = dataclasses.field(default_factory=list)
    # Batches in flight from stage 0 under the new plan (the number of stages unless --in-flight says);
    # 0 = unchanged. A plan with more stages than the first one pipelines deeper.
    in_flight: int = 0

    def __post_init__(self) -> None:
        _check_groups(self.groups, self.shares, self.worker_list)


@dataclasses.dataclass(frozen=True)
class FetchRequest(Message):
    """Device -> current owner: send me these layers (weights and momentum) for plan ``plan_id``."""

    KIND = MessageKind.FETCH
    run_id: str
    plan_id: int
    requester: str
    owner: str  # the device asked: it holds the weights (its own, or a replica of ``of_device``)
    layers: list[int]
    version: int = -1  # -1: the live weights; otherwise the replica (or seeded start, 0) of that version
    of_device: str = ""  # whose weights; "" means the owner's own


MESSAGE_TYPES: dict[MessageKind, type[Message]] = {
    cls.KIND: cls
    for cls in (
        Discover,
        Announce,
        Status,
        Heartbeat,
        Assign,
        Ready,
        Activation,
        Gradient,
        EvalResult,
        Command,
        Weights,
        Commit,
        Metrics,
        Event,
        ErrorReport,
        Probe,
        Profile,
        LinkReport,
        Repartition,
        FetchRequest,
        GradSync,
    )
}


# ---------------------------------------------------------------------------------------------
# Encoding


def encode(msg: Message, *, sender: str) -> bytes:
    """Serialise a message into its envelope (CBOR or JSON, by the message's kind)."""
    body = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
    if isinstance(msg, Command):
        run_id = body.pop("run_id")
        body = {"run_id": run_id, "name": msg.NAME, "args": body}
    envelope = {"v": FORMAT_VERSION, "k": msg.KIND.value, "s": sender, "b": body}
    if msg.ENCODING == "json":
        try:
            return json.dumps(envelope, separators=(",", ":"), allow_nan=False).encode()
        except ValueError as exc:  # NaN or infinity, e.g. a diverging loss in metrics
            raise ProtocolError(f"{msg.KIND.value} has a value JSON cannot carry: {exc}") from exc
    return cbor2.dumps(_to_cbor(envelope))


def _to_cbor(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return encode_tensor(value)
    if isinstance(value, Compressed):
        return to_wire(value)
    if isinstance(value, TrainOptions):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _to_cbor(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_cbor(v) for v in value]
    return value


def decode(payload: bytes, *, open_values: bool = False) -> tuple[str, Message]:
    """Return ``(sender, message)``. Raises :class:`ProtocolError` on anything malformed.

    ``open_values`` accepts any string in a field with a fixed set of values (``Status.state``, say):
    for observers such as the monitor, which show a newer device's new state rather than drop it. The
    roles never set it: they act on these values.
    """
    if len(payload) > MAX_DECODE_BYTES:
        raise ProtocolError(f"payload of {len(payload)} bytes exceeds the {MAX_DECODE_BYTES}-byte limit")
    if not payload:
        raise ProtocolError("empty payload")
    try:
        envelope = json.loads(payload) if payload[:1] == b"{" else cbor2.loads(payload)
    except Exception as exc:  # json and cbor2 raise many types for garbage
        raise ProtocolError(f"undecodable payload of {len(payload)} bytes: {exc}") from exc
    if not isinstance(envelope, dict):
        raise ProtocolError(f"envelope must be a map, got {type(envelope).__name__}")
    version = envelope.get("v")
    if type(version) is not int or version != FORMAT_VERSION:
        raise ProtocolError(
            f"format version {version!r} is not supported (this side speaks {FORMAT_VERSION})"
        )
    try:
        kind = MessageKind(envelope.get("k"))
    except ValueError as exc:
        raise ProtocolError(f"unknown message kind {envelope.get('k')!r}") from exc
    sender, body = envelope.get("s"), envelope.get("b")
    if not isinstance(sender, str) or not isinstance(body, dict):
        raise ProtocolError(f"{kind.value} envelope lacks a sender string or a body map")
    checker = _OPEN if open_values else _STRICT
    if kind is MessageKind.COMMAND:
        return sender, _build_command(body, checker)
    return sender, _build(MESSAGE_TYPES[kind], body, checker)


def _build_command(body: dict[str, Any], checker: _Checker) -> Command:
    name, args = body.get("name"), body.get("args", {})
    cls = COMMAND_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ProtocolError(f"unknown command {name!r}; known: {sorted(COMMAND_TYPES)}")
    if not isinstance(args, dict):
        raise ProtocolError(f"command.args: expected a map, got {type(args).__name__}")
    unknown = set(body) - {"run_id", "name", "args"}
    if unknown:
        raise ProtocolError(f"command {name!r} has unknown fields {sorted(unknown)}")
    if "run_id" in args:
        raise ProtocolError(f"command {name!r}: run_id belongs in the body, not in args")
    command = _build(cls, {**args, "run_id": body.get("run_id")}, checker)
    assert isinstance(command, Command)
    return command


_SCHEMAS: dict[type[Any], tuple[dict[str, Any], dict[str, dataclasses.Field[Any]]]] = {}


def _schema(cls: type[Any]) -> tuple[dict[str, Any], dict[str, dataclasses.Field[Any]]]:
    """Type hints and fields of a message class, worked out once (get_type_hints is slow)."""
    if cls not in _SCHEMAS:
        _SCHEMAS[cls] = typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls)}
    return _SCHEMAS[cls]


def _build(cls: type[Any], body: dict[str, Any], checker: _Checker, name: str = "") -> Any:
    """``cls`` (a message, or a record inside one) from a decoded map, every field checked."""
    name = name or cls.KIND.value
    hints, fields = _schema(cls)
    if not all(isinstance(k, str) for k in body):
        raise ProtocolError(f"{name} body has non-string keys")
    unknown = set(body) - set(fields)
    if unknown:
        raise ProtocolError(f"{name} has unknown fields {sorted(unknown)}")
    values: dict[str, Any] = {}
    for field_name, f in fields.items():
        if field_name not in body:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"{name} lacks field {field_name!r}")
            continue
        values[field_name] = checker.check(hints[field_name], body[field_name], f"{name}.{field_name}")
    return cls(**values)


class _Checker:
    """Checks a decoded value against a field's type and returns it in that type (tensors decoded).

    One method per kind of type: generic types (``list[int]``, ``X | None``, ``Literal[...]``) by their
    origin, plain types by themselves.
    """

    def __init__(self, *, open_values: bool = False) -> None:
        self.open_values = open_values

    def check(self, tp: Any, value: Any, where: str) -> Any:
        origin = typing.get_origin(tp)
        method = _BY_ORIGIN.get(origin) if origin is not None else _BY_TYPE.get(tp)
        if method is None:
            # A programming error (a field type without a decoder), reported like bad input.
            raise ProtocolError(f"{where}: no decoder for {tp}")
        return method(self, tp, value, where)

    def _union(self, tp: Any, value: Any, where: str) -> Any:
        problems = []
        for arg in typing.get_args(tp):
            try:
                return self.check(arg, value, where)
            except ProtocolError as exc:
                problems.append(str(exc))
        raise ProtocolError(f"{where}: {type(value).__name__} fits none of {tp} ({'; '.join(problems)})")

    def _literal(self, tp: Any, value: Any, where: str) -> Any:
        allowed = typing.get_args(tp)
        if any(type(value) is type(a) and value == a for a in allowed):
            return value
        if self.open_values and all(isinstance(a, str) for a in allowed) and isinstance(value, str):
            return value
        values = ", ".join(repr(a) for a in allowed)
        if not isinstance(value, (str, int, float, bool)):
            raise ProtocolError(f"{where}: expected one of {values}, got {type(value).__name__}")
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:36] + "...'"
        raise ProtocolError(f"{where}: {shown} is not one of {values}")

    def _none(self, tp: Any, value: Any, where: str) -> None:
        if value is not None:
            raise ProtocolError(f"{where}: expected null")

    def _any(self, tp: Any, value: Any, where: str) -> Any:
        return value

    def _tensor(self, tp: Any, value: Any, where: str) -> torch.Tensor:
        return decode_tensor(value)

    def _record(self, tp: Any, value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected a map, got {type(value).__name__}")
        return _build(tp, value, self, where)

    def _compressed(self, tp: Any, value: Any, where: str) -> Compressed:
        try:
            return from_wire(value)
        except ProtocolError as exc:
            raise ProtocolError(f"{where}: {exc}") from None

    def _float(self, tp: Any, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError(f"{where}: expected a number, got {type(value).__name__}")
        try:
            number = float(value)
        except OverflowError:
            raise ProtocolError(f"{where}: {str(value)[:20]}... does not fit a float") from None
        if not math.isfinite(number):
            raise ProtocolError(f"{where}: expected a finite number, got {number}")
        return number

    def _scalar(self, tp: Any, value: Any, where: str) -> Any:
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ProtocolError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
        return value

    def _list(self, tp: Any, value: Any, where: str) -> list[Any]:
        if not isinstance(value, (list, tuple)):
            raise ProtocolError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)
        return [self.check(item, v, f"{where}[{i}]") for i, v in enumerate(value)]

    def _dict(self, tp: Any, value: Any, where: str) -> dict[Any, Any]:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected a map, got {type(value).__name__}")
        key_t, val_t = typing.get_args(tp)
        return {
            self.check(key_t, k, f"{where} key"): self.check(val_t, v, f"{where}[{k!r}]")
            for k, v in value.items()
        }


_Method = Callable[[_Checker, Any, Any, str], Any]
_BY_ORIGIN: dict[Any, _Method] = {
    Union: _Checker._union,
    types.UnionType: _Checker._union,
    Literal: _Checker._literal,
    list: _Checker._list,
    dict: _Checker._dict,
}
_BY_TYPE: dict[Any, _Method] = {
    type(None): _Checker._none,
    Any: _Checker._any,
    torch.Tensor: _Checker._tensor,
    Compressed: _Checker._compressed,
    TrainOptions: _Checker._record,
    float: _Checker._float,
    int: _Checker._scalar,
    str: _Checker._scalar,
    bytes: _Checker._scalar,
    bool: _Checker._scalar,
}
_STRICT, _OPEN = _Checker(), _Checker(open_values=True)
