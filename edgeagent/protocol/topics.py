"""The topic tree. Every topic string in edgeagent is built (and parsed) here and nowhere else.

::

    edgeagent/v1/<cluster>/
        discovery/request           central -> all      JSON  who is there?
        discovery/announce          worker  -> central  JSON  I am here (also sent unasked at start)
        device/<id>/status          device  -> all      JSON  retained; the last will says "offline"
        device/<id>/heartbeat       device  -> central  JSON  every heartbeat interval
        device/<id>/metrics         device  -> all      JSON  compute/comm/idle time, throughput
        device/<id>/control         central -> device   CBOR  the assignment (Table I state)
        device/<id>/reply           device  -> central  CBOR  ready, weights, errors
        device/<id>/replica         device  -> peers    CBOR  replica uploads (fault tolerance)
        device/<id>/profile         central -> device   YAML  retained device profile (operations)
        device/<id>/probe           device  -> device   CBOR  bandwidth probes and their echoes
        device/<id>/request         device  -> device   CBOR  fetch requests for layers (re-partition)
        stage/<s>/act               stage s -> s+1      CBOR  activations produced by stage s
        stage/<s>/grad              stage s -> s-1      CBOR  gradients produced by stage s
        stage/<s>/result            last    -> central  CBOR  evaluation results of the last stage
        run/commit                  central -> all      CBOR  commit barrier of a new partition
        run/command                 central -> all      JSON  start, stop, collect, ...
        run/events                  central -> all      JSON  partition, replication, recovery events

Data-plane topics are named after the stage that *produces* them, so an ACL can say "a device
publishes only its own stage's outputs".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from edgeagent.errors import ProtocolError

ROOT = "edgeagent"
PROTOCOL_VERSION = "v1"
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
    ANNOUNCE = "discovery/announce"
    STATUS = "status"
    HEARTBEAT = "heartbeat"
    METRICS = "metrics"
    CONTROL = "control"
    REPLY = "reply"
    REPLICA = "replica"
    PROFILE = "profile"
    PROBE = "probe"
    REQUEST = "request"
    ACTIVATIONS = "act"
    GRADIENTS = "grad"
    RESULTS = "result"
    COMMIT = "run/commit"
    COMMAND = "run/command"
    EVENTS = "run/events"


_DEVICE_FAMILIES = {
    f.value: f
    for f in (
        Family.STATUS,
        Family.HEARTBEAT,
        Family.METRICS,
        Family.CONTROL,
        Family.REPLY,
        Family.REPLICA,
        Family.PROFILE,
        Family.PROBE,
        Family.REQUEST,
    )
}
# Per-device families only the device itself publishes (its ``control`` and ``profile`` topics are the
# central node's): a message there must name that device as its sender, and a broker ACL lets only
# that device write them.
DEVICE_PUBLISHED: frozenset[Family] = frozenset(
    {
        Family.STATUS,
        Family.HEARTBEAT,
        Family.METRICS,
        Family.REPLY,
        Family.REPLICA,
        Family.PROBE,
        Family.REQUEST,
    }
)
_STAGE_FAMILIES = {f.value: f for f in (Family.ACTIVATIONS, Family.GRADIENTS, Family.RESULTS)}
_FIXED_FAMILIES = {
    f.value: f for f in (Family.DISCOVER, Family.ANNOUNCE, Family.COMMIT, Family.COMMAND, Family.EVENTS)
}


@dataclass(frozen=True)
class TopicInfo:
    """A parsed topic: its family and the device id or stage index it names, if any."""

    family: Family
    device: str | None = None
    stage: int | None = None


@dataclass(frozen=True)
class Topics:
    """Builds the topics of one cluster."""

    cluster: str = "default"

    def __post_init__(self) -> None:
        check_name("cluster", self.cluster)

    @property
    def base(self) -> str:
        return f"{ROOT}/{PROTOCOL_VERSION}/{self.cluster}"

    def all(self) -> str:
        """Wildcard for everything of this cluster (what a monitor subscribes to)."""
        return f"{self.base}/#"

    def fixed(self, family: Family) -> str:
        if family.value not in _FIXED_FAMILIES:
            raise ValueError(f"{family} needs a device or a stage")
        return f"{self.base}/{family.value}"

    def device(self, family: Family, device_id: str) -> str:
        if family.value not in _DEVICE_FAMILIES:
            raise ValueError(f"{family} is not a per-device topic")
        return f"{self.base}/device/{check_name('device id', device_id)}/{family.value}"

    def devices(self, family: Family) -> str:
        """Wildcard for one family of every device, e.g. all heartbeats."""
        return f"{self.base}/device/+/{family.value}"

    def stage(self, family: Family, stage: int) -> str:
        if family.value not in _STAGE_FAMILIES:
            raise ValueError(f"{family} is not a per-stage topic")
        if stage < 0:
            raise ValueError(f"stage must be >= 0, got {stage}")
        return f"{self.base}/stage/{stage}/{family.value}"

    # Shorthands for the topics used most.
    def activations(self, stage: int) -> str:
        return self.stage(Family.ACTIVATIONS, stage)

    def gradients(self, stage: int) -> str:
        return self.stage(Family.GRADIENTS, stage)

    def results(self, stage: int) -> str:
        return self.stage(Family.RESULTS, stage)

    def parse(self, topic: str) -> TopicInfo:
        """Parse a topic of this cluster; raise :class:`ProtocolError` for anything else."""
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
            len(parts) == 3
            and parts[0] == "stage"
            and parts[2] in _STAGE_FAMILIES
            and _STAGE.fullmatch(parts[1])
        ):
            return TopicInfo(_STAGE_FAMILIES[parts[2]], stage=int(parts[1]))
        raise ProtocolError(f"unknown topic {topic!r}")


def topic_matches(pattern: str, topic: str) -> bool:
    """MQTT wildcard matching (``+`` one level, ``#`` the rest)."""
    pat, top = pattern.split("/"), topic.split("/")
    for i, p in enumerate(pat):
        if p == "#":
            return True
        if i >= len(top) or (p != "+" and p != top[i]):
            return False
    return len(pat) == len(top)
