"""What a role accepts from the network: payload sizes, per-topic rates and inbox caps. Pure policy, no I/O.

Every payload a role receives passes an :class:`InboxGate` before it is decoded and queued for the
role's own thread (``Intake.on_payload``, runtime/intake.py):

1. **Size** per topic family: the control plane (status, heartbeats, metrics, discovery, commands,
   events; small JSON) gets :attr:`InboxLimits.control_max_bytes`, the data plane and the weights
   (activations, gradients, results, assignments, replies and replicas with whole stages' weights,
   probes, fetch requests, profiles, commits) get :attr:`InboxLimits.data_max_bytes`.
2. **Rate**, a token bucket per concrete topic: ``rate`` messages per second with bursts of ``burst``.
3. **Inbox room**: at most ``max_queued_per_topic`` messages of one topic and ``max_queued`` messages
   (``max_queued_bytes`` bytes) of all topics wait for the role's thread. A slot is taken when a
   message is queued (:meth:`InboxGate.enqueue`) and given back when the role takes it
   (:meth:`InboxGate.release`).

The gate remembers at most ``max_topics`` topics, least recently used first out: wildcard
subscriptions (``device/+/request``) let a flooder invent topics, and the table must not grow with
them. (A flooder cycling through more topics than that gets a fresh bucket per topic; the inbox caps
still bound what is buffered.)

Drops are counted per reason and described by log lines that are themselves rate limited: the first
``log_first`` drops of a topic get a line each naming the topic, the size or rate, the limit and what
to do; after that at most one summary line per topic every ``log_interval`` seconds with the count; and
never more than ``log_budget`` lines per ``log_interval`` for all topics together. A flood does not
flood the log.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from edgeagent.compression.base import all_finite
from edgeagent.protocol.messages import field_names
from edgeagent.protocol.topics import DEVICE_PUBLISHED, Family, TopicInfo

KIB = 1024
MIB = 1024 * KIB
_EPSILON = 1e-9  # a bucket refilled by float arithmetic to 0.9999999999 holds a whole token

CONTROL_PLANE: frozenset[Family] = frozenset(
    {
        Family.DISCOVER,
        Family.ANNOUNCE,
        Family.STATUS,
        Family.HEARTBEAT,
        Family.METRICS,
        Family.COMMAND,
        Family.EVENTS,
    }
)
"""Small JSON messages; everything else is the data plane (tensors, weights) and its set-up."""


# Drop reasons, as counted by :attr:`InboxGate.drops`.
OVERSIZE = "oversize"
RATE = "rate"
TOPIC_QUEUE = "topic_queue"
QUEUE = "queue"
TOPIC = "topic"  # not a topic of the protocol
MALFORMED = "malformed"
SENDER = "sender"
INVALID = "invalid"  # well-formed, but does not fit the run (a tensor of the wrong shape, say)
NONFINITE = "nonfinite"  # a tensor holds NaN or an infinity: it would poison every weight it reaches


@dataclass(frozen=True)
class InboxLimits:
    """What a role accepts. The defaults never throttle legitimate traffic (see each field).

    Pass an instance as ``Role(..., limits=InboxLimits(...))`` to tighten or widen them.
    """

    # Control-plane messages are a few hundred bytes of JSON (the largest: metrics and events, < 4 KiB).
    control_max_bytes: int = 64 * KIB
    # Tensors and weights: a MobileNetV2 stage's weights travel whole on replica, reply and control;
    # the transport itself drops anything above 256 MiB, so this adds nothing stricter by default.
    data_max_bytes: int = 256 * MIB
    # Heartbeats come once a second per device, statuses and metrics about as often, discovery and
    # commands a handful per run: 100/s with bursts of 200 is 100 times the legitimate rate.
    control_rate: float = 100.0
    control_burst: float = 200.0
    # The fastest benchmarks move a few thousand messages a second on one stage topic (small models,
    # small batches): 5000/s with bursts of 10000 leaves headroom and still bounds a flood's CPU cost.
    data_rate: float = 5000.0
    data_burst: float = 10000.0
    # Legitimately a topic has at most the pipeline's batches in flight (a few) waiting; a role whose
    # thread is busy for seconds may collect some hundreds of heartbeats and statuses.
    max_queued_per_topic: int = 1024
    max_queued: int = 8192
    # Bytes waiting in the inbox: several stages' weights (tens of MB) at the most, legitimately.
    max_queued_bytes: int = 1024 * MIB
    # Distinct topics tracked (buckets, queue counts, log state); least recently used beyond this go.
    max_topics: int = 4096
    # Logging of drops: per topic the first ``log_first`` drops, then a summary every ``log_interval``
    # seconds; at most ``log_budget`` lines per ``log_interval`` in all.
    log_first: int = 3
    log_interval: float = 10.0
    log_budget: int = 20

    def __post_init__(self) -> None:
        for name in (
            "control_max_bytes",
            "data_max_bytes",
            "max_queued_per_topic",
            "max_queued",
            "max_queued_bytes",
            "max_topics",
            "log_budget",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"InboxLimits.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("control_rate", "data_rate", "log_interval"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"InboxLimits.{name} must be a positive number, got {value}")
        for name in ("control_burst", "data_burst"):
            value = getattr(self, name)
            if not (value >= 1 and math.isfinite(value)):
                raise ValueError(f"InboxLimits.{name} must allow at least one message, got {value}")
        if self.log_first < 0:
            raise ValueError(f"InboxLimits.log_first must be >= 0, got {self.log_first}")

    def max_bytes(self, family: Family) -> int:
        return self.control_max_bytes if family in CONTROL_PLANE else self.data_max_bytes

    def bucket(self, family: Family) -> tuple[float, float]:
        """``(rate per second, burst)`` of one topic of ``family``."""
        if family in CONTROL_PLANE:
            return self.control_rate, self.control_burst
        return self.data_rate, self.data_burst

    def field_name(self, family: Family, kind: str) -> str:
        """The name of the limit of ``kind`` (``max_bytes``, ``rate``) that applies to ``family``."""
        plane = "control" if family in CONTROL_PLANE else "data"
        return f"{plane}_{kind}"


def sender_problem(info: TopicInfo, sender: str) -> str | None:
    """Why ``sender`` may not have published on this topic, or None.

    On another device's own topics (its status, heartbeats, replies, replicas, probes, requests) the
    envelope must name that device: with a broker ACL that lets each login publish only on its own
    device topics, a payload cannot then pretend to come from another device.
    """
    own = info.family in DEVICE_PUBLISHED or info.family is Family.LINK  # a link's sender is its device
    if info.device is None or not own or sender == info.device:
        return None
    return (
        f"sender {sender!r} on device {info.device!r}'s topic: only {info.device!r} publishes "
        f"{info.family.value} messages there"
    )


TensorMeta = tuple[tuple[int, ...], torch.dtype]
"""A tensor's shape (for activations: one sample's, without the batch dimension) and dtype."""


def _describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def activation_problem(
    x: torch.Tensor, y: torch.Tensor, *, sample: TensorMeta | None, num_classes: int
) -> str | None:
    """Why a batch ``(x, y)`` cannot be the input of a stage, or None.

    ``sample`` is what one sample of the stage's input looks like (None: unknown, only the batch and the
    labels are checked). A tensor that does not fit would make the forward pass raise (or, with labels
    outside the classes, the loss), so it is dropped on receipt, before it can take a legitimate batch's
    place.
    """
    if x.dim() < 1 or x.shape[0] < 1:
        return f"x {_describe(x)} holds no batch"
    if sample is not None:
        shape, dtype = sample
        if tuple(x.shape[1:]) != shape or x.dtype != dtype:
            want = ", ".join(["B", *map(str, shape)])
            return f"x is {_describe(x)}, expected ({want}) {str(dtype).removeprefix('torch.')}"
    elif not x.is_floating_point():
        return f"x is {_describe(x)}, expected floating point"
    if y.dtype != torch.int64 or y.dim() != 1 or y.shape[0] != x.shape[0]:
        return f"labels y are {_describe(y)}, expected ({x.shape[0]},) int64"
    low, high = (int(v) for v in torch.aminmax(y))  # one pass over the labels
    if low < 0 or high >= num_classes:
        return f"labels y from {low} to {high} are not all in [0, {num_classes})"
    return None


def _nonfinite_tensor(t: torch.Tensor) -> str | None:
    if all_finite(t):
        return None
    nans = int(torch.isnan(t).sum())
    return f"{nans} NaN and {int((~torch.isfinite(t)).sum()) - nans} infinite of {t.numel()} values"


_SCALARS = frozenset({str, int, float, bool, bytes, type(None), list})  # a list's items are not looked at


def nonfinite_problem(message: object) -> str | None:
    """Which tensor of ``message`` (a message dataclass) holds a value that is not finite, or None.

    Every tensor field is looked at, and every tensor of a field that maps names to tensors (weights,
    momentum, gradient sums). A compressed tensor's parameters are checked when it is decoded, and the
    tensor itself where it is restored (``compression.stage.restore``). One NaN that got through would
    reach every weight downstream, the replicas and the checkpoints: such a message is dropped at
    intake, never repaired.
    """
    for field_name in field_names(type(message)):
        value = getattr(message, field_name)
        items: list[tuple[str, Any]]
        if type(value) in _SCALARS:  # no tensor in it (and no slow Mapping check for it)
            continue
        if isinstance(value, Mapping):
            items = [(f"{field_name}[{k!r}]", v) for k, v in value.items()]
        else:
            items = [(field_name, value)]
        for name, item in items:
            problem = _nonfinite_tensor(item) if isinstance(item, torch.Tensor) else None
            if problem is not None:
                return f"{name} holds values that are not finite ({problem})"
    return None


def gradient_problem(g: torch.Tensor, expected: TensorMeta | None) -> str | None:
    """Why ``g`` cannot be the gradient of an output ``expected`` (None: no such batch in flight), or None."""
    if expected is None:
        return "no such batch waits for its gradient here"
    shape, dtype = expected
    if tuple(g.shape) != shape or g.dtype != dtype:
        return f"g is {_describe(g)}, expected {shape} {str(dtype).removeprefix('torch.')}"
    return None


@dataclass(frozen=True)
class Verdict:
    """What the gate decided: ``reason`` is None when the message is accepted.

    ``log`` is the line to log at WARNING level, when one is due (most drops of a flood have none).
    """

    reason: str | None = None
    log: str | None = None

    @property
    def accepted(self) -> bool:
        return self.reason is None


ACCEPT = Verdict()


@dataclass
class _TopicState:
    tokens: float
    stamp: float
    queued: int = 0
    logged: int = 0  # detail lines written for this topic
    last_line: float = -math.inf
    pending: int = 0  # drops since the last line about this topic
    reasons: Counter[str] = field(default_factory=Counter)
    latest: str = ""  # the latest drop's description


class InboxGate:
    """Applies :class:`InboxLimits` to one role's incoming payloads. Thread-safe; ``now`` is injected.

    ``name`` (the role's device id) starts every log line.
    """

    def __init__(self, limits: InboxLimits | None = None, *, name: str = "") -> None:
        self.limits = limits or InboxLimits()
        self.name = name
        self.drops: Counter[str] = Counter()  # per reason
        self.queued = 0
        self.queued_bytes = 0
        self._topics: OrderedDict[str, _TopicState] = OrderedDict()
        self._lock = threading.Lock()
        self._log_tokens = float(self.limits.log_budget)
        self._log_stamp: float | None = None
        self._pending_topics: set[str] = set()
        self._untracked = 0  # drops of forgotten topics that no line has reported yet
        self._next_flush = -math.inf

    @property
    def dropped(self) -> int:
        return sum(self.drops.values())

    @property
    def tracked(self) -> int:
        """Topics the gate currently remembers."""
        return len(self._topics)

    def queued_on(self, topic: str) -> int:
        with self._lock:
            state = self._topics.get(topic)
            return state.queued if state is not None else 0

    # -- decisions -----------------------------------------------------------------------------

    def admit(self, topic: str, family: Family, size: int, now: float, *, queued: bool = True) -> Verdict:
        """Size and rate of one payload of ``size`` bytes on ``topic``; with ``queued``, also whether the
        inbox has room for it (checked again, atomically, by :meth:`enqueue` once it is decoded).

        Takes a token of the topic's bucket unless the payload is too big.
        """
        limits = self.limits
        with self._lock:
            state = self._state(topic, family, now)
            limit = limits.max_bytes(family)
            if size > limit:
                return self._drop(
                    topic,
                    state,
                    OVERSIZE,
                    f"dropped a {size}-byte message on {topic}: over the {limit}-byte limit for "
                    f"{family.value} messages; if it is legitimate, raise InboxLimits."
                    f"{limits.field_name(family, 'max_bytes')}, else find the publisher",
                    now,
                )
            rate, burst = limits.bucket(family)
            state.tokens = min(burst, state.tokens + max(0.0, now - state.stamp) * rate)
            state.stamp = max(state.stamp, now)
            if state.tokens < 1.0 - _EPSILON:
                return self._drop(
                    topic,
                    state,
                    RATE,
                    f"dropped a message on {topic}: more than {rate:g} messages/s (bursts of {burst:g}); "
                    f"if the traffic is legitimate, raise InboxLimits.{limits.field_name(family, 'rate')}, "
                    "else find the publisher that floods it",
                    now,
                )
            state.tokens -= 1.0
            if queued:
                full = self._queue_full(topic, state, size)
                if full is not None:
                    return self._drop(topic, state, full[0], full[1], now)
            return ACCEPT

    def enqueue(self, topic: str, size: int, now: float) -> Verdict:
        """Take an inbox slot for a decoded message, or drop it when the inbox is full."""
        with self._lock:
            state = self._topics.get(topic)
            if state is None:  # forgotten meanwhile (a flood over many topics)
                state = self._new_state(topic, Family.COMMAND, now, tokens=0.0)
            else:
                self._topics.move_to_end(topic)
            full = self._queue_full(topic, state, size)
            if full is not None:
                return self._drop(topic, state, full[0], full[1], now)
            state.queued += 1
            self.queued += 1
            self.queued_bytes += size
            return ACCEPT

    def release(self, topic: str, size: int) -> None:
        """The role took a queued message of ``topic`` off its inbox."""
        with self._lock:
            self.queued = max(0, self.queued - 1)
            self.queued_bytes = max(0, self.queued_bytes - size)
            state = self._topics.get(topic)
            if state is not None and state.queued > 0:
                state.queued -= 1

    def reject(self, topic: str, reason: str, detail: str, now: float) -> Verdict:
        """Count (and maybe log) a drop the role decided itself: a malformed payload, an unknown topic, a
        sender that does not own the topic. ``detail`` says what was dropped and why."""
        with self._lock:
            state = self._topics.get(topic)
            if state is None:
                state = self._new_state(topic, Family.COMMAND, now)
            else:
                self._topics.move_to_end(topic)
            return self._drop(topic, state, reason, detail, now)

    def flush(self, now: float) -> list[str]:
        """Summary lines that are due for topics whose latest drops no line reported yet.

        Cheap to call often: it looks at the topics at most once a second.
        """
        with self._lock:
            if now < self._next_flush:
                return []
            self._next_flush = now + 1.0
            lines = []
            for topic in sorted(self._pending_topics):
                state = self._topics.get(topic)
                if state is None or state.pending == 0:
                    self._pending_topics.discard(topic)
                    continue
                if now - state.last_line >= self.limits.log_interval and self._take_log_token(now):
                    lines.append(self._summary(topic, state, now))
            if self._untracked and self._take_log_token(now):
                lines.append(
                    f"{self._prefix()}{self._untracked} more dropped messages on topics no longer tracked "
                    f"(more than {self.limits.max_topics} topics had drops: a flood over invented topics?)"
                )
                self._untracked = 0
            return lines

    # -- internals (called with the lock held) -------------------------------------------------

    def _prefix(self) -> str:
        return f"{self.name}: " if self.name else ""

    def _new_state(
        self, topic: str, family: Family, now: float, *, tokens: float | None = None
    ) -> _TopicState:
        burst = self.limits.bucket(family)[1]
        state = _TopicState(tokens=burst if tokens is None else tokens, stamp=now)
        self._topics[topic] = state
        while len(self._topics) > self.limits.max_topics:
            old_topic, old = self._topics.popitem(last=False)
            self._untracked += old.pending
            self._pending_topics.discard(old_topic)
        return state

    def _state(self, topic: str, family: Family, now: float) -> _TopicState:
        state = self._topics.get(topic)
        if state is None:
            return self._new_state(topic, family, now)
        self._topics.move_to_end(topic)
        return state

    def _queue_full(self, topic: str, state: _TopicState, size: int) -> tuple[str, str] | None:
        limits = self.limits
        if state.queued >= limits.max_queued_per_topic:
            return TOPIC_QUEUE, (
                f"dropped a message on {topic}: {state.queued} messages of this topic already wait in the "
                f"inbox (InboxLimits.max_queued_per_topic={limits.max_queued_per_topic}); the role's "
                "thread is not keeping up, or the topic is flooded"
            )
        if self.queued >= limits.max_queued or self.queued_bytes + size > limits.max_queued_bytes:
            return QUEUE, (
                f"dropped a {size}-byte message on {topic}: the inbox holds {self.queued} messages, "
                f"{self.queued_bytes} bytes (InboxLimits.max_queued={limits.max_queued}, "
                f"max_queued_bytes={limits.max_queued_bytes}); the role's thread is not keeping up, "
                "or some topics are flooded"
            )
        return None

    def _take_log_token(self, now: float) -> bool:
        limits = self.limits
        if self._log_stamp is not None:
            refill = (now - self._log_stamp) * limits.log_budget / limits.log_interval
            self._log_tokens = min(float(limits.log_budget), self._log_tokens + max(0.0, refill))
        self._log_stamp = now if self._log_stamp is None else max(self._log_stamp, now)
        if self._log_tokens < 1.0 - _EPSILON:
            return False
        self._log_tokens -= 1.0
        return True

    def _drop(self, topic: str, state: _TopicState, reason: str, detail: str, now: float) -> Verdict:
        self.drops[reason] += 1
        state.pending += 1
        state.reasons[reason] += 1
        state.latest = detail
        self._pending_topics.add(topic)
        line = None
        if state.logged < self.limits.log_first:
            if self._take_log_token(now):
                state.logged += 1
                line = self._prefix() + detail
                if state.pending > 1:  # earlier drops of this topic that the budget kept out of the log
                    line += f" ({state.pending - 1} earlier drops here not logged)"
                self._reported(topic, state, now)
        elif now - state.last_line >= self.limits.log_interval and self._take_log_token(now):
            line = self._summary(topic, state, now)
        return Verdict(reason, line)

    def _summary(self, topic: str, state: _TopicState, now: float) -> str:
        since = "" if state.last_line == -math.inf else f" in the last {now - state.last_line:.0f} s"
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(state.reasons.items()))
        line = (
            f"{self._prefix()}{state.pending} more messages dropped on {topic}{since} ({reasons}); "
            f"latest: {state.latest}"
        )
        self._reported(topic, state, now)
        return line

    def _reported(self, topic: str, state: _TopicState, now: float) -> None:
        state.pending = 0
        state.reasons.clear()
        state.last_line = now
        self._pending_topics.discard(topic)
