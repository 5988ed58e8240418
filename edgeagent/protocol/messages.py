"""Typed messages: one frozen dataclass per kind, the fields every receiver can count on.

Each message kind is a frozen dataclass; :func:`edgeagent.protocol.wire.decode` checks every field's
type, so a role never sees a half-valid message (the envelope, CBOR and JSON are
:mod:`edgeagent.protocol.wire`'s; the run's commands are :mod:`edgeagent.protocol.commands`). Fields with
a fixed set of values are ``Literal`` types, defined once here (:data:`StatusState`,
:data:`ActivationMode`, :data:`ReadyPhase`, :data:`WeightsPurpose`, :data:`ErrorCode`) for the roles and
the monitor to use; the decoder rejects any other value, naming the field and the values it allows. A
new value (a new error code) is added to its alias, and a receiver that does not know it yet drops the
message. ``Assign.mode`` is the exception: a worker that does not know the training mode an assignment
names answers with an ``assign`` error, so that the central node stops at once with the reason instead
of waiting for a stage that never comes.

A training mode's own messages live in its package (``edgeagent.modes.<name>.messages``: PiPar's
split-federated training's, data-parallel training's collectives'), with their kinds (a :class:`Kind` of
their own beside :class:`MessageKind`); the registry (:data:`edgeagent.mode_names.MODES`) names that
module, and the wire codec loads it when it first decodes (:func:`edgeagent.protocol.wire.message_types`).
"""

from __future__ import annotations

import dataclasses
import math
from enum import Enum
from typing import Any, ClassVar, Literal

import torch

from edgeagent.compression.base import Compressed
from edgeagent.errors import ProtocolError
from edgeagent.protocol.options import TrainOptions


class Kind(str, Enum):
    """A message's kind, the envelope's ``k``: the base of :class:`MessageKind` (the nodes' shared messages)
    and of each training mode's own kinds (declared with its messages). Their values are one namespace on
    the wire: the codec refuses two messages of one kind."""


class MessageKind(Kind):
    """The kinds of the messages every mode shares (discovery, liveness, the pipeline's data plane)."""

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
ReadyPhase = Literal["built", "fetched", "alive", "resent"]
"""``Ready.phase``: ``fetched``: has every layer of a new plan; ``built``: the stage runs; ``alive``: the
answer to a ping (with the weight versions it holds)."""
WeightsPurpose = Literal["collect", "chain", "global", "redistribute"]
"""``Weights.purpose``: the answer to ``collect``, a chain or global replica, or layers moving owner."""
ErrorCode = Literal[
    "message",
    "compute",
    "busy",
    "assign",
    "repartition",
    "profile",
    "command",
    "probe",
    "diverged",
    "nonfinite",
]
"""``ErrorReport.code``: what a role rejected (a message it could not take, a failed computation, an
assignment while busy or one it cannot build, a re-partition, a profile, a command, a link probe),
``diverged``: the last stage's training loss is not finite (the run cannot go on), or ``nonfinite``: a
message of the run from the device ``ErrorReport.about`` names held values that are not finite and was
dropped (the central node ends a run that such a device keeps from making progress)."""


@dataclasses.dataclass(frozen=True)
class Message:
    """Base of all messages. Subclasses set ``KIND`` and ``ENCODING``."""

    KIND: ClassVar[Kind]
    ENCODING: ClassVar[Encoding] = "cbor"


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(cls: type) -> tuple[str, ...]:
    """The fields of a message (or command) class, in order, worked out once: the encoder and the
    non-finite check read every message's fields."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


# ---------------------------------------------------------------------------------------------
# Discovery and liveness (JSON)


MAX_H = 10
"""Entries of ``Announce.h`` at most: the representative sub-models of papers/004 Sec. 3.2
(``edgeagent.predictor.submodels.REPRESENTATIVES``)."""
MAX_TILES = 64
"""Entries of ``Announce.tiles`` at most (``edgeagent.predictor.measure.model_tiling``: 8 ranges)."""


@dataclasses.dataclass(frozen=True)
class Discover(Message):
    """The central node asks every device of the cluster to announce itself; with ``model`` (a
    ``ModelSpec.to_dict()``) and ``batch_size``, idle devices measure their ``h`` for it first
    (papers/004 Sec. 3.2) and announce it."""

    KIND = MessageKind.DISCOVER
    ENCODING = "json"
    run_id: str
    model: dict[str, Any] = dataclasses.field(default_factory=dict)  # empty: no model named
    batch_size: int = 0

    def __post_init__(self) -> None:
        check_model_request(self.model, self.batch_size, "discover", optional=True)


def check_model_request(model: dict[str, Any], batch_size: int, what: str, *, optional: bool) -> None:
    """A model to measure ``h`` for comes with a batch size >= 1; no model (where ``optional``), with 0."""
    if not model:
        if not optional:
            raise ProtocolError(f"{what}: names no model")
        if batch_size != 0:
            raise ProtocolError(f"{what}: batch size {batch_size} without a model")
    elif batch_size < 1:
        raise ProtocolError(f"{what}: a model needs a batch size >= 1, got {batch_size}")


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
    # Its uplink is paced (an emulated slow link, --link-mbps): its replicas can take the bulk lane in the
    # link's idle time (CentralConfig.replica_share). False: replicas go at once, the paper's way.
    paces: bool = False
    # The device's h (papers/004 Sec. 3.2): forward+backward seconds of each representative sub-model
    # of the model with digest ``h_key`` (edgeagent.predictor.measure.model_key) at batch size
    # ``h_batch``, at the announced slowdown, and the seconds measuring took. Empty: not measured; fewer
    # than MAX_H entries: the measuring budget ran out.
    h: list[float] = dataclasses.field(default_factory=list)
    h_key: str = ""
    h_batch: int = 0
    h_seconds: float = 0.0
    # Seconds of each range of the model's tiling, measured with h (the per-layer correction); empty: not
    # measured.
    tiles: list[float] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        where = f"announce of {self.device_id!r}"
        if len(self.h) > MAX_H:
            raise ProtocolError(f"{where}: h has {len(self.h)} entries, at most {MAX_H}")
        if len(self.tiles) > MAX_TILES:
            raise ProtocolError(f"{where}: tiles has {len(self.tiles)} entries, at most {MAX_TILES}")
        for name, values in (("h", self.h), ("tiles", self.tiles)):
            bad = [x for x in values if not (math.isfinite(x) and x >= 0)]
            if bad:
                raise ProtocolError(f"{where}: {name} must hold finite seconds >= 0, got {bad[0]}")
        if not (math.isfinite(self.h_seconds) and self.h_seconds >= 0) or self.h_batch < 0:
            raise ProtocolError(
                f"{where}: h_seconds {self.h_seconds} and h_batch {self.h_batch} must be finite and >= 0"
            )
        if self.h and (not self.h_key or self.h_batch < 1):
            raise ProtocolError(f"{where}: h without the model (h_key) and batch size (h_batch) it is for")


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
    replica_share: float = 0.0  # of an emulated slow uplink (CentralConfig.replica_share); 0: at once
    # Whether stages log the activations and gradients they send, which a recovery without a rollback
    # replays (CentralConfig.recovery_mode "resume"); "rollback" replays from the replicas and needs none.
    recovery_logs: bool = True
    metrics_interval: float = 1.0  # seconds between metrics messages of every device of the run
    # One sample of every layer's output (batch dimension left out): a stage starting at layer j > 0
    # takes layer_shapes[j - 1]; activations that do not fit are dropped on receipt. Empty: unchecked.
    layer_shapes: list[list[int]] = dataclasses.field(default_factory=list)
    layer_dtypes: list[str] = dataclasses.field(default_factory=list)  # "float32", ... per layer output
    # The training mode whose worker session takes this run (edgeagent.modes.MODES). Not an enumeration on
    # the wire: a worker that lacks the mode says so (an "assign" error) rather than dropping the message.
    mode: str = "pipeline"
    batch_size: int = 0  # split-federated: the run's batch size B (the device profiles the model at B)
    # Hybrid stages: every device of every stage, the stage's primary (``worker_list[k]``) first, and each
    # member's share of every batch's rows; empty = one device per stage (``worker_list``).
    groups: list[list[str]] = dataclasses.field(default_factory=list)
    shares: list[list[float]] = dataclasses.field(default_factory=list)
    share_version: int = 0  # bumped when a stage's members change inside a plan (failover)
    # The mode's own settings (its worker session checks them): the allreduce mode's collective, timeouts,
    # failed links and data split, say. Empty for the pipeline modes.
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The central node's heartbeat interval (s; 0: not said): how long a worker waits for a central node
    # whose last will came before it leaves the run is derived from it (roles.worker.central_watch).
    heartbeat_interval: float = 0.0

    def __post_init__(self) -> None:
        check_groups(self.groups, self.shares, self.worker_list)
        if not (math.isfinite(self.heartbeat_interval) and 0 <= self.heartbeat_interval <= 3600):
            raise ProtocolError(f"assign: heartbeat_interval {self.heartbeat_interval} is not in [0, 3600] s")


def check_groups(groups: list[list[str]], shares: list[list[float]], worker_list: list[str]) -> None:
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
    version: int = -1  # for "resent": the stage's version (updates applied) after the gradients resent
    # For "resent" by the stage before a dead one: one past the newest batch it sent the dead stage.
    sent: int = -1


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
    about: str = ""  # code nonfinite: the device that sent what was dropped


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
    # Batches between chain replications under the new plan (CentralConfig.chain_seconds: ResPipe's T in
    # seconds at the measured rate); 0 = unchanged.
    chain_every: int = 0

    def __post_init__(self) -> None:
        check_groups(self.groups, self.shares, self.worker_list)


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
