"""Who may publish, subscribe to and receive which topics: pure policy, no I/O.

Three roles:

* ``central``: everything under its cluster (it drives the run and is stage 0).
* ``device``: publishes only topics with its own id in them: its own device topics (the announcement
  among them), and, under its id, the outputs (activations, gradients, results, gradient exchange) of
  the stages it holds, alone or as one of a group's devices, in the current (or the previous) plan of
  its cluster (``stage/<s>/<kind>/<id>``); reads the run-wide topics, its own control and profile
  topics, the peer topics it needs (status, replicas, probes, fetch requests) and the data-plane
  topics; on the allreduce mode's links (``link/<from>/<to>``) it publishes only links it sends on
  (``<from>`` is itself) and reads only links into itself (``<to>`` is itself).
* ``observer``: reads everything of its cluster and publishes nothing (monitors, Home Assistant).

A grant's cluster may be ``*`` (every cluster), e.g. for an operator's central login.

Home Assistant discovery lives outside edgeagent's tree, under the grant's discovery prefix
(``homeassistant`` unless ``edgeagent credentials add --home-assistant-prefix`` says otherwise):

* ``central`` may publish its cluster's discovery configs, ``<prefix>/<component>/edgeagent_<cluster>/
  <object>/config`` (:mod:`edgeagent.ops.homeassistant`), and nothing else of Home Assistant's.
* ``observer`` (Home Assistant's own login) reads everything under the prefix and may publish
  ``<prefix>/status``: Home Assistant's birth message and last will, which it sends by default and
  without which the embedded broker would refuse its connection (a will is checked like a publish).
* ``device`` gets nothing there.

Stage ownership follows the run: :class:`PlanTracker` learns it from the assignments and re-partitions
the central node publishes (``device/<id>/control``) and from its ``reshare`` commands (``run/command``:
a stage's group changed inside a plan), so "the gradient topic of a stage it does not hold" changes
with every re-partition. Static brokers (Mosquitto) get :func:`mosquitto_acl`, which cannot follow the
plan: it confines every device to topics with its own id (its stage outputs included: every stage's, but
only as itself), and the receivers take a stage's outputs only from the devices the plan says hold it
(:mod:`edgeagent.protocol.identity`).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from edgeagent.protocol.topics import (
    ANY,
    DEFAULT_DISCOVERY_PREFIX,
    DEVICE_PUBLISHED,
    REST,
    STAGE_OUTPUTS,
    DiscoveryKind,
    DiscoveryTopics,
    Family,
    TopicFilters,
    Topics,
    cluster_level,
    discovery_node_id,
    fill_wildcards,
    filter_wildcards,
)

RoleName = Literal["central", "device", "observer"]
ROLES: tuple[RoleName, ...] = ("central", "device", "observer")

# What a device publishes on its own device topics, in a fixed order (for the generated files).
DEVICE_OWN = tuple(f for f in Family if f in DEVICE_PUBLISHED)
# Peer topics every device may read (replicas, layer requests and probes of its neighbours).
DEVICE_READS_PEERS = (Family.STATUS, Family.REPLICA, Family.PROBE, Family.REQUEST)
# Its own split-federated gradients too: only the device whose activations they answer reads them.
DEVICE_READS_OWN = (Family.CONTROL, Family.PROFILE, Family.SPLIT_GRADIENTS)
DEVICE_READS_FIXED = (Family.DISCOVER, Family.COMMIT, Family.COMMAND, Family.EVENTS)
# Stage topics every device may read: its neighbours' activations and gradients, its group's gradient
# exchange (results are the central node's).
DEVICE_READS_STAGES = (Family.ACTIVATIONS, Family.GRADIENTS, Family.SYNC, Family.INPUTS)


HomeAssistantTopic = DiscoveryKind


@dataclass(frozen=True)
class Grant:
    """One login's role, the cluster it belongs to (``*``: all clusters) and its Home Assistant
    discovery prefix (validated by :func:`edgeagent.ops.homeassistant.check_prefix` where logins are made)."""

    role: RoleName
    cluster: str = "default"
    home_assistant_prefix: str = DEFAULT_DISCOVERY_PREFIX

    def home_assistant(self, topic: str) -> HomeAssistantTopic | None:
        """What a topic (or filter) under this grant's discovery prefix is, or None if it is not there.

        ``config``: a discovery config of this grant's cluster; ``status``: Home Assistant's birth and
        will topic; ``other``: anything else under the prefix (other clusters' and other things' configs).
        """
        info = DiscoveryTopics(self.home_assistant_prefix).parse(topic)
        if info is None or info.node is None:  # not under the prefix; or the status, or another topic
            return info.kind if info else None
        node = info.node  # a config's
        ours = (
            node.startswith(discovery_node_id(""))
            if self.cluster == "*"
            else node == discovery_node_id(self.cluster)
        )
        return "config" if ours else "other"

    def clusters(self, topic: str) -> str | None:
        """The cluster a topic (or filter) of this grant names, or None if it is not this grant's."""
        cluster = cluster_level(topic)
        if cluster is None:
            return None
        if self.cluster == "*":
            return cluster if cluster not in (ANY, REST) else None
        return self.cluster if cluster == self.cluster else None


Groups = list[list[str]]


class TrackedPlan(NamedTuple):
    """What :class:`PlanTracker` keeps of a cluster: the newest plan's run and id, its stages' members
    (per stage, primary first), the previous plan's (``[]``: none yet in this run) and the share version
    of the newest groups (a reshare inside the plan bumps it)."""

    run_id: str
    plan_id: int
    groups: Groups
    previous: Groups
    share_version: int = 0


def _as_groups(stages: list[str] | Groups) -> Groups:
    """Groups as stored; a plain device order (the state files before hybrid stages) is one per stage."""
    return [[str(d)] if isinstance(d, str) else [str(m) for m in d] for d in stages]


@dataclass
class PlanTracker:
    """Per cluster, the members of every stage in the newest plan and in the one before it.

    A device may write a stage's outputs if it is one of the stage's devices (its primary or a helper) in
    either plan: during a re-partition the old plan drains while the new one is announced. A reshare
    (the members of some stages changing inside a plan) replaces the newest plan's groups and keeps the
    previous plan's.
    """

    plans: dict[str, TrackedPlan] = field(default_factory=dict)

    def update(
        self,
        cluster: str,
        run_id: str,
        plan_id: int,
        worker_list: list[str],
        *,
        groups: Groups | None = None,
        share_version: int = 0,
    ) -> bool:
        """Record a plan (``groups``: every member of every stage, primary first; empty or None: one device
        per stage, ``worker_list``); returns True if it changed anything.

        Within a run, an older plan is ignored, and so is the same plan with an older ``share_version`` (a
        reshare overtaken by a newer one) or with the same one and the same groups.
        """
        current = _as_groups(groups) if groups else _as_groups(worker_list)
        known = self.plans.get(cluster)
        if known is not None and known.run_id == run_id:
            if plan_id < known.plan_id:
                return False
            if plan_id == known.plan_id and (
                share_version < known.share_version
                or (share_version == known.share_version and current == known.groups)
            ):
                return False
            previous = known.groups if plan_id > known.plan_id else known.previous
        else:
            previous = []
        self.plans[cluster] = TrackedPlan(run_id, plan_id, current, previous, share_version)
        return True

    def owns(self, cluster: str, device: str, stage: int) -> bool:
        """Whether ``device`` holds ``stage`` (alone or in its group) in the newest or the previous plan."""
        known = self.plans.get(cluster)
        if known is None:
            return False
        return any(
            0 <= stage < len(groups) and device in groups[stage] for groups in (known.groups, known.previous)
        )

    def to_json(self) -> str:
        return json.dumps({cluster: list(plan) for cluster, plan in self.plans.items()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PlanTracker:
        """Load :meth:`to_json`'s state, or that of an older broker (``[run_id, plan_id, worker_list,
        previous_worker_list]``, one device per stage)."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("plan state must be a JSON object")
        plans = {}
        for cluster, entry in raw.items():
            if not isinstance(entry, list) or len(entry) not in (4, 5):
                raise ValueError(f"plan state of cluster {cluster!r} must be a list of 4 or 5 items")
            run_id, plan_id, current, previous, *version = entry
            plans[str(cluster)] = TrackedPlan(
                str(run_id),
                int(plan_id),
                _as_groups(current),
                _as_groups(previous),
                int(version[0]) if version else 0,
            )
        return cls(plans)


def _parse(topic: str, cluster: str) -> tuple[Family, str | None, int | None] | None:
    """A topic's family, the device it names (a link's sender, a stage output's producer) and stage."""
    try:
        info = Topics(cluster).parse(topic)
    except Exception:
        return None
    if info.family is Family.LINK:  # a link's sender is its device; the receiver is checked by _link_peer
        return info.family, info.device, None
    return info.family, info.device, info.stage


def _link_peer(topic: str, cluster: str) -> str | None:
    """The receiver of a link topic (``link/<from>/<to>``), None for any other topic."""
    try:
        return Topics(cluster).parse(topic).peer
    except Exception:
        return None


def may_publish(user: str, grant: Grant, topic: str, plans: PlanTracker) -> bool:
    discovery = grant.home_assistant(topic)
    if discovery is not None:
        return (grant.role, discovery) in (("central", "config"), ("observer", "status"))
    cluster = grant.clusters(topic)
    if cluster is None:
        return False
    if grant.role == "central":
        return True
    if grant.role != "device":
        return False
    parsed = _parse(topic, cluster)
    if parsed is None:
        return False
    family, device, stage = parsed
    if device != user:  # everything a device publishes names it
        return False
    if stage is not None:
        return family in STAGE_OUTPUTS and plans.owns(cluster, user, stage)
    return family is Family.LINK or family in DEVICE_OWN


def may_receive(user: str, grant: Grant, topic: str) -> bool:
    if grant.home_assistant(topic) is not None:
        return grant.role == "observer"
    cluster = grant.clusters(topic)
    if cluster is None:
        return False
    if grant.role in ("central", "observer"):
        return True
    parsed = _parse(topic, cluster)
    if parsed is None:
        return False
    family, device, stage = parsed
    if family is Family.LINK:
        return _link_peer(topic, cluster) == user
    if stage is not None:
        return family in DEVICE_READS_STAGES
    if device is not None:
        return family in DEVICE_READS_PEERS or (device == user and family in DEVICE_READS_OWN)
    return family in DEVICE_READS_FIXED


def may_subscribe(user: str, grant: Grant, pattern: str) -> bool:
    """A filter within the grant's cluster. A device's filter may match only what it may read: live
    messages are checked again per message (:func:`may_receive`), but brokers (amqtt among them) send the
    retained messages a new subscription matches without that check, so a filter like ``device/+/profile``
    or ``#`` would hand a device every other device's retained profile."""
    if grant.home_assistant(pattern) is not None:
        return grant.role == "observer"
    if grant.clusters(pattern) is None:
        return False
    if grant.role != "device":
        return True
    wild, rest = filter_wildcards(pattern)
    if rest or wild > 3:
        return False
    # Each "+" as a stage number, as some other device's id and as its own id: all must be readable.
    for choice in itertools.product(("0", "peer-device", user), repeat=wild):
        if not may_receive(user, grant, fill_wildcards(pattern, choice)):
            return False
    return True


def device_client_id(user: str, grant: Grant) -> str | None:
    """The MQTT client id a device connects with (``ea-<cluster>-<id>``, as the roles do)."""
    return f"ea-{grant.cluster}-{user}" if grant.role == "device" and grant.cluster != "*" else None


def client_id_ok(user: str, grant: Grant, client_id: str, users: dict[str, Grant]) -> bool:
    """A device must use its own client id, and nobody may take another device's: MQTT hands a
    client id's session to its newest connection, which would disconnect the device."""
    own = device_client_id(user, grant)
    if own is not None:
        return client_id == own
    return all(client_id != device_client_id(other, g) for other, g in users.items() if other != user)


def mosquitto_acl(users: dict[str, Grant]) -> str:
    """A Mosquitto ``acl_file`` for these logins (static: stage ownership cannot follow the plan, so a
    device may write every stage's outputs, but only under its own id; the receivers check the plan)."""
    lines = [
        "# Generated by `edgeagent credentials`; do not edit (it is rewritten on every change).",
        "# Every topic a device may write has its own id in it. Mosquitto ACLs are static: a device may",
        "# write its outputs of every stage (stage/+/<kind>/<id>); the receivers take a stage's outputs only",
        "# from the devices the current plan gives that stage, and the embedded broker",
        "# (`edgeagent broker --credentials`) also refuses them.",
        "",
    ]
    for user, grant in sorted(users.items()):
        tree = TopicFilters(ANY if grant.cluster == "*" else grant.cluster)
        discovery = DiscoveryTopics(grant.home_assistant_prefix)
        lines.append(f"user {user}")
        if grant.role == "central":
            lines.append(f"topic readwrite {tree.all()}")
            # A "*" grant's node ids (edgeagent_<any cluster>) are not one topic level Mosquitto can
            # match: it may write every node's configs here (the embedded broker still checks the name).
            node = ANY if grant.cluster == "*" else discovery_node_id(grant.cluster)
            lines.append(f"topic write {discovery.configs(node)}")
        elif grant.role == "observer":
            lines.append(f"topic read {tree.all()}")
            lines.append(f"topic read {discovery.all()}")
            lines.append(f"topic write {discovery.status()}")
        else:
            lines += [f"topic read {tree.fixed(f)}" for f in DEVICE_READS_FIXED]
            for f in DEVICE_OWN:
                mode = "readwrite" if f in DEVICE_READS_PEERS else "write"
                lines.append(f"topic {mode} {tree.device(f, user)}")
            lines += [f"topic read {tree.device(f, user)}" for f in DEVICE_READS_OWN]
            lines += [f"topic read {tree.device(f)}" for f in DEVICE_READS_PEERS]
            lines += [f"topic write {tree.stage(f, user)}" for f in STAGE_OUTPUTS]
            lines += [f"topic read {tree.stage(f)}" for f in DEVICE_READS_STAGES]
            lines.append(f"topic write {tree.link(user, ANY)}")
            lines.append(f"topic read {tree.link(ANY, user)}")
        lines.append("")
    return "\n".join(lines)
