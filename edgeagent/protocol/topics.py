"""The topic tree. Every topic string in edgeagent is built (and parsed) here and nowhere else.

::

    edgeagent/v1/<cluster>/
        discovery/request           central -> all      JSON  who is there?
        device/<id>/announce        worker  -> central  JSON  I am here (also sent unasked at start)
        device/<id>/status          device  -> all      JSON  retained; the last will says "offline"
        device/<id>/heartbeat       device  -> central  JSON  every heartbeat interval
        device/<id>/metrics         device  -> all      JSON  compute/comm/idle time, throughput
        device/<id>/control         central -> device   CBOR  the assignment (Table I state)
        device/<id>/reply           device  -> central  CBOR  ready, weights, errors
        device/<id>/replica         device  -> peers    CBOR  replica uploads (fault tolerance)
        device/<id>/profile         central -> device   YAML  retained device profile (operations)
        device/<id>/probe           device  -> device   CBOR  bandwidth probes and their echoes
        device/<id>/request         device  -> device   CBOR  fetch requests for layers (re-partition)
        device/<id>/split-act       device  -> central  CBOR  split-federated: its activations and labels
        device/<id>/split-grad      central -> device   CBOR  split-federated: the activations' gradients
        stage/<s>/act/<id>          stage s -> s+1      CBOR  activations stage s produced on device <id>
        stage/<s>/grad/<id>         stage s -> s-1      CBOR  gradients stage s produced on device <id>
        stage/<s>/result/<id>       last    -> central  CBOR  evaluation results of the last stage
        stage/<s>/sync/<id>         stage s -> stage s  CBOR  a hybrid stage member's parameter gradients
        stage/0/input/<id>          central -> stage 0  CBOR  input rows for stage 0's helpers (hybrid)
        run/commit                  central -> all      CBOR  commit barrier of a new partition
        run/command                 central -> all      JSON  start, stop, collect, ...
        run/events                  central -> all      JSON  partition, replication, recovery events
        link/<from>/<to>            device  -> device   CBOR  one link of an allreduce (--mode allreduce)

Note: identity is in the topic. Everything a device says about itself goes on a topic with its id in it
(``device/<id>/...``; the data plane's ``stage/<s>/<kind>/<id>``, named after the stage that *produces*
it and the device that computed it; a link's sender, ``link/<id>/<to>``), so a broker ACL can confine
each login to its own id, even a static ACL (Mosquitto's, one block per login), and a receiver checks
the rest: the envelope's sender and every device the payload names must be the topic's device
(:mod:`edgeagent.protocol.identity`), and a stage output must come from a device the plan says holds
the stage.

Here too: the filters brokers' ACLs and the monitor subscribe with (:class:`TopicFilters`, with ``+`` for
a cluster or a device), topics of any cluster (:func:`parse_topic`, :func:`cluster_level`), wildcard
levels (:func:`filter_wildcards`, :func:`fill_wildcards`), and Home Assistant's discovery topics, which
live outside this tree under a discovery prefix (:class:`DiscoveryTopics`)::

    <prefix>/<component>/<node id>/<object id>/config   a discovery config (retained)
    <prefix>/status                                     Home Assistant's birth message and last will
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from edgeagent.errors import ProtocolError

ROOT = "edgeagent"
PROTOCOL_VERSION = "v1"
ANY = "+"  # a filter's single-level wildcard
REST = "#"  # a filter's multi-level wildcard (the last level)
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_STAGE = re.compile(r"0|[1-9][0-9]{0,8}")


def check_name(kind: str, value: str) -> str:
    """Validate a cluster or device id: 1-64 of ``A-Z a-z 0-9 _ . -`` (no ``/``, ``+`` or ``#``)."""
    if not _NAME.fullmatch(value):
        raise ProtocolError(f"invalid {kind} {value!r}: use 1-64 characters from A-Z a-z 0-9 _ . -")
    return value


class Family(str, Enum):
    """What a topic is for; ``parse`` returns one of these."""

    DISCOVER = "discovery/request"
    ANNOUNCE = "announce"  # a device's birth message and answer to discovery (only it publishes)
    STATUS = "status"
    HEARTBEAT = "heartbeat"
    METRICS = "metrics"
    CONTROL = "control"
    REPLY = "reply"
    REPLICA = "replica"
    PROFILE = "profile"
    PROBE = "probe"
    REQUEST = "request"
    SPLIT_ACTIVATIONS = "split-act"  # split-federated: a device's activations (only it publishes)
    SPLIT_GRADIENTS = "split-grad"  # split-federated: their gradients (only the central node publishes)
    ACTIVATIONS = "act"
    GRADIENTS = "grad"
    RESULTS = "result"
    SYNC = "sync"  # a replicated stage's members exchange parameter gradients (hybrid stages)
    INPUTS = "input"  # the central node's input rows for the helpers of a replicated stage 0 (hybrid)
    LINK = "link"  # one sender -> receiver link of data-parallel training's collectives (allreduce mode)
    COMMIT = "run/commit"
    COMMAND = "run/command"
    EVENTS = "run/events"


_DEVICE_FAMILIES = {
    f.value: f
    for f in (
        Family.ANNOUNCE,
        Family.STATUS,
        Family.HEARTBEAT,
        Family.METRICS,
        Family.CONTROL,
        Family.REPLY,
        Family.REPLICA,
        Family.PROFILE,
        Family.PROBE,
        Family.REQUEST,
        Family.SPLIT_ACTIVATIONS,
        Family.SPLIT_GRADIENTS,
    )
}
# Per-device families only the device itself publishes (its ``control`` and ``profile`` topics are the
# central node's): a message there must name that device as its sender, and a broker ACL lets only
# that device write them.
DEVICE_PUBLISHED: frozenset[Family] = frozenset(
    {
        Family.ANNOUNCE,
        Family.STATUS,
        Family.HEARTBEAT,
        Family.METRICS,
        Family.REPLY,
        Family.REPLICA,
        Family.PROBE,
        Family.REQUEST,
        Family.SPLIT_ACTIVATIONS,
    }
)
# The data plane: a stage's outputs, each on a topic of the stage that produced it and the device that
# computed it (``stage/<s>/<family>/<device>``); only that device publishes there.
# ``input`` is the odd one: the batch's input rows, "produced" by the data (``stage`` -1 in the message) on
# stage 0's topic, for stage 0's helpers; only the central node (stage 0's primary) sends them.
STAGE_OUTPUTS: tuple[Family, ...] = (
    Family.ACTIVATIONS,
    Family.GRADIENTS,
    Family.RESULTS,
    Family.SYNC,
    Family.INPUTS,
)
_STAGE_FAMILIES = {f.value: f for f in STAGE_OUTPUTS}
_FIXED_FAMILIES = {f.value: f for f in (Family.DISCOVER, Family.COMMIT, Family.COMMAND, Family.EVENTS)}


@dataclass(frozen=True)
class TopicInfo:
    """A parsed topic: its family and the device id or stage index it names, if any."""

    family: Family
    device: str | None = None  # on a link topic: its sender; on a stage topic: the producing device
    stage: int | None = None
    peer: str | None = None  # on a link topic: its receiver


class _Tree:
    """The levels every topic and filter of a cluster starts with (``cluster`` may be ``+``)."""

    cluster: str

    @property
    def base(self) -> str:
        return f"{ROOT}/{PROTOCOL_VERSION}/{self.cluster}"

    def all(self) -> str:
        """Wildcard for everything of this cluster (what a monitor subscribes to)."""
        return f"{self.base}/{REST}"

    def fixed(self, family: Family) -> str:
        if family.value not in _FIXED_FAMILIES:
            raise ValueError(f"{family} needs a device or a stage")
        return f"{self.base}/{family.value}"

    def _device_level(self, family: Family, device: str) -> str:
        if family.value not in _DEVICE_FAMILIES:
            raise ValueError(f"{family} is not a per-device topic")
        return f"{self.base}/device/{device}/{family.value}"


@dataclass(frozen=True)
class Topics(_Tree):
    """Builds the topics of one cluster."""

    cluster: str = "default"

    def __post_init__(self) -> None:
        check_name("cluster", self.cluster)

    def device(self, family: Family, device_id: str) -> str:
        return self._device_level(family, check_name("device id", device_id))

    def devices(self, family: Family) -> str:
        """Wildcard for one family of every device, e.g. all heartbeats."""
        return f"{self.base}/device/{ANY}/{family.value}"

    def stage(self, family: Family, stage: int, device: str) -> str:
        """Where ``device`` publishes what it computed as (one of the devices of) stage ``stage``."""
        return f"{self._stage_level(family, stage)}/{check_name('device id', device)}"

    def stage_filter(self, family: Family, stage: int) -> str:
        """Wildcard: one family of one stage, from every device (what the stage's receivers subscribe to)."""
        return f"{self._stage_level(family, stage)}/{ANY}"

    def _stage_level(self, family: Family, stage: int) -> str:
        if family.value not in _STAGE_FAMILIES:
            raise ValueError(f"{family} is not a per-stage topic")
        if stage < 0:
            raise ValueError(f"stage must be >= 0, got {stage}")
        return f"{self.base}/stage/{stage}/{family.value}"

    # Shorthands for the topics used most (``device``: the one that computed the message).
    def activations(self, stage: int, device: str) -> str:
        return self.stage(Family.ACTIVATIONS, stage, device)

    def gradients(self, stage: int, device: str) -> str:
        return self.stage(Family.GRADIENTS, stage, device)

    def results(self, stage: int, device: str) -> str:
        return self.stage(Family.RESULTS, stage, device)

    def inputs(self, device: str) -> str:
        """Where the central node ``device`` sends stage 0's helpers their rows of every batch's input."""
        return self.stage(Family.INPUTS, 0, device)

    def syncs(self, stage: int, device: str) -> str:
        """Where a member of a replicated stage sends its parameter gradients to the other members."""
        return self.stage(Family.SYNC, stage, device)

    def link(self, sender: str, receiver: str) -> str:
        """The logical link from ``sender`` to ``receiver`` (allreduce mode): only ``sender`` publishes."""
        return f"{self.base}/link/{check_name('device id', sender)}/{check_name('device id', receiver)}"

    def links_to(self, receiver: str) -> str:
        """Wildcard: every link into ``receiver``."""
        return f"{self.base}/link/{ANY}/{check_name('device id', receiver)}"

    def parse(self, topic: str) -> TopicInfo:
        """Parse a topic of this cluster; raise :class:`ProtocolError` for anything else (every message
        received is parsed: the last topics' results are kept, a :class:`TopicInfo` being immutable)."""
        return _parse(self, topic)

    def _parse(self, topic: str) -> TopicInfo:
        prefix = self.base + "/"
        if not topic.startswith(prefix):
            raise ProtocolError(f"topic {topic!r} is not under {prefix!r}")
        rest = topic[len(prefix) :]
        if rest in _FIXED_FAMILIES:
            return TopicInfo(_FIXED_FAMILIES[rest])
        parts = rest.split("/")
        if len(parts) == 3 and parts[0] == "device" and parts[2] in _DEVICE_FAMILIES:
            return TopicInfo(_DEVICE_FAMILIES[parts[2]], device=check_name("device id", parts[1]))
        if (
            len(parts) == 4
            and parts[0] == "stage"
            and parts[2] in _STAGE_FAMILIES
            and _STAGE.fullmatch(parts[1])
        ):
            family, device = _STAGE_FAMILIES[parts[2]], check_name("device id", parts[3])
            return TopicInfo(family, device=device, stage=int(parts[1]))
        if len(parts) == 3 and parts[0] == Family.LINK.value:
            sender, receiver = check_name("device id", parts[1]), check_name("device id", parts[2])
            return TopicInfo(Family.LINK, device=sender, peer=receiver)
        raise ProtocolError(f"unknown topic {topic!r}")


@functools.lru_cache(maxsize=256)
def _parse(topics: Topics, topic: str) -> TopicInfo:
    """:meth:`Topics.parse`, for the last 256 topics parsed (a topic that does not parse raises each time)."""
    return topics._parse(topic)


@functools.lru_cache(maxsize=1024)
def _topics_of(cluster: str) -> Topics:
    return Topics(cluster)


def cluster_level(topic: str) -> str | None:
    """The cluster level of a topic or filter under ``edgeagent/v1/`` with at least one level after it,
    as written (a name, ``+`` or ``#``, unchecked); None for anything else."""
    levels = topic.split("/", 3)
    if len(levels) < 4 or levels[0] != ROOT or levels[1] != PROTOCOL_VERSION:
        return None
    return levels[2]


def parse_topic(topic: str) -> tuple[str, TopicInfo]:
    """Parse a topic of any cluster: ``(cluster, info)``; raise :class:`ProtocolError` for anything else."""
    cluster = cluster_level(topic)
    if cluster is None:
        raise ProtocolError(f"topic {topic!r} is not under {ROOT}/{PROTOCOL_VERSION}/<cluster>/")
    return cluster, _topics_of(cluster).parse(topic)  # Topics() checks the cluster name


@dataclass(frozen=True)
class TopicFilters(_Tree):
    """Filters (subscriptions, ACL patterns) of one cluster, or of every cluster (``cluster="+"``).

    The levels are used as given: a cluster or device id the caller has checked, or :data:`ANY`.
    """

    cluster: str = ANY

    def device(self, family: Family, device: str = ANY) -> str:
        return self._device_level(family, device)

    def stage(self, family: Family, device: str = ANY) -> str:
        """One family of every stage, from ``device`` (``+``: from every device)."""
        if family.value not in _STAGE_FAMILIES:
            raise ValueError(f"{family} is not a per-stage topic")
        return f"{self.base}/stage/{ANY}/{family.value}/{device}"

    def link(self, sender: str = ANY, receiver: str = ANY) -> str:
        """Links from ``sender`` to ``receiver`` (either may be ``+``)."""
        return f"{self.base}/link/{sender}/{receiver}"


def filter_wildcards(pattern: str) -> tuple[int, bool]:
    """How many ``+`` levels a filter has, and whether it has a ``#`` level."""
    levels = pattern.split("/")
    return sum(level == ANY for level in levels), REST in levels


def fill_wildcards(pattern: str, values: Sequence[str]) -> str:
    """The topic a filter names when its ``+`` levels are ``values``, in order (one value per ``+``)."""
    levels = pattern.split("/")
    wild = [i for i, level in enumerate(levels) if level == ANY]
    for i, value in zip(wild, values, strict=True):
        levels[i] = value
    return "/".join(levels)


# ---------------------------------------------------------------------------------------------
# Home Assistant's discovery topics (outside edgeagent's tree)

DEFAULT_DISCOVERY_PREFIX = "homeassistant"
_PREFIX_LEVEL = re.compile(r"[A-Za-z0-9_.-]{1,64}")

DiscoveryKind = Literal["config", "status", "other"]
# Home Assistant's node and object ids: "[a-zA-Z0-9_-]" only.
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_-]")


def discovery_node_id(cluster: str) -> str:
    """The discovery node id of a cluster's configs (``edgeagent_<cluster>``, ``.`` made ``_``): the level
    a cluster's central login may publish discovery configs under (acl.py)."""
    return "edgeagent_" + _UNSAFE_ID.sub("_", cluster)


def check_discovery_prefix(prefix: str) -> str:
    """A discovery prefix: 1-4 topic levels of ``A-Z a-z 0-9 _ . -``, not inside edgeagent's own tree.

    Raises ValueError naming the allowed form: the prefix becomes a topic right (acl.py), so a wildcard
    or ``edgeagent/...`` would grant far more than discovery.
    """
    levels = prefix.split("/") if isinstance(prefix, str) else []
    if not levels or not all(_PREFIX_LEVEL.fullmatch(level) for level in levels) or len(levels) > 4:
        raise ValueError(
            f"Home Assistant discovery prefix {prefix!r}: use 1-4 topic levels of A-Z a-z 0-9 _ . - "
            f"(no +, # or empty levels), e.g. {DEFAULT_DISCOVERY_PREFIX!r}"
        )
    if levels[0] == ROOT:
        raise ValueError(f"Home Assistant discovery prefix {prefix!r} may not lie under {ROOT}/")
    return prefix


@dataclass(frozen=True)
class DiscoveryInfo:
    """A topic under a discovery prefix: a ``config`` (with its node id), the ``status`` or ``other``."""

    kind: DiscoveryKind
    node: str | None = None


@dataclass(frozen=True)
class DiscoveryTopics:
    """Home Assistant's MQTT discovery topics under ``prefix`` (checked where logins are made)."""

    prefix: str = DEFAULT_DISCOVERY_PREFIX

    def config(self, component: str, node: str, object_id: str) -> str:
        """A discovery config; as a filter with ``+`` levels too (``configs``)."""
        return f"{self.prefix}/{component}/{node}/{object_id}/config"

    def configs(self, node: str = ANY) -> str:
        """Filter: every discovery config of one node id (``+``: of every node)."""
        return self.config(ANY, node, ANY)

    def status(self) -> str:
        """Home Assistant's birth message and last will."""
        return f"{self.prefix}/status"

    def all(self) -> str:
        return f"{self.prefix}/{REST}"

    def parse(self, topic: str) -> DiscoveryInfo | None:
        """What a topic (or filter) under the prefix is; None if it is not under the prefix.

        ``config``: a config topic without wildcards (``node`` says whose); ``status``: the birth and will
        topic; ``other``: anything else under the prefix, filters included.
        """
        head = self.prefix + "/"
        if not topic.startswith(head):
            return None
        rest = topic[len(head) :].split("/")
        if rest == ["status"]:
            return DiscoveryInfo("status")
        if len(rest) == 4 and rest[3] == "config" and not {ANY, REST} & set(rest):
            return DiscoveryInfo("config", node=rest[1])
        return DiscoveryInfo("other")


def topic_matches(pattern: str, topic: str) -> bool:
    """MQTT wildcard matching (``+`` one level, ``#`` the rest)."""
    pat, top = pattern.split("/"), topic.split("/")
    for i, p in enumerate(pat):
        if p == "#":
            return True
        if i >= len(top) or (p != "+" and p != top[i]):
            return False
    return len(pat) == len(top)
