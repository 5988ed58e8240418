"""Optional Home Assistant MQTT discovery of each device's training status (off by default).

With ``--home-assistant`` the central node publishes, retained, one discovery config per device and
sensor under ``<prefix>/sensor/edgeagent_<cluster>/<object id>/config``; Home Assistant then reads the
states straight from edgeagent's own JSON status and metrics topics. Nothing else changes on the wire.

The ``edgeagent_<cluster>`` level is Home Assistant's optional node id. It is there for the broker's
topic rights (:mod:`edgeagent.protocol.acl`): a cluster's central login may publish discovery configs
of its own node only, so it cannot rewrite the configs of the other things in the house.
"""

from __future__ import annotations

import json
from typing import Any

from edgeagent.protocol.topics import (
    DEFAULT_DISCOVERY_PREFIX,
    DiscoveryTopics,
    Family,
    Topics,
    check_discovery_prefix,
    discovery_node_id,
)

DEFAULT_PREFIX = DEFAULT_DISCOVERY_PREFIX


def check_prefix(prefix: str) -> str:
    """A discovery prefix: topic levels of ``A-Z a-z 0-9 _ . -``, not inside edgeagent's own tree.

    Raises ValueError naming the allowed form. The prefix becomes a topic right (acl.py), so a
    wildcard or ``edgeagent/...`` would grant far more than discovery.
    """
    return check_discovery_prefix(prefix)


SENSORS: tuple[tuple[str, str, Family, str, str | None], ...] = (
    # (key, name, topic family, value template, unit)
    ("state", "training state", Family.STATUS, "{{ value_json.b.state }}", None),
    ("stage", "pipeline stage", Family.STATUS, "{{ value_json.b.stage }}", None),
    (
        "throughput",
        "throughput",
        Family.METRICS,
        "{{ value_json.b['values'].samples_per_second | round(1) }}",
        "samples/s",
    ),
    ("batches", "batches", Family.METRICS, "{{ value_json.b['values'].batches }}", None),
)


def discovery_configs(topics: Topics, device_id: str, *, prefix: str = DEFAULT_PREFIX) -> dict[str, bytes]:
    """Topic -> retained JSON payload for each sensor of one device."""
    node = discovery_node_id(topics.cluster)
    discovery = DiscoveryTopics(prefix)
    base_id = f"edgeagent_{topics.cluster}_{device_id}".replace("-", "_").replace(".", "_")
    out = {}
    for key, name, family, template, unit in SENSORS:
        config: dict[str, Any] = {
            "name": f"{device_id} {name}",
            "unique_id": f"{base_id}_{key}",
            "state_topic": topics.device(family, device_id),
            "value_template": template,
            "availability_topic": topics.device(Family.STATUS, device_id),
            "availability_template": (
                "{{ 'offline' if value_json.b.state in ('offline', 'left') else 'online' }}"
            ),
            "device": {
                "identifiers": [base_id],
                "name": f"edgeagent {device_id}",
                "manufacturer": "edgeagent",
                "model": f"cluster {topics.cluster}",
            },
        }
        if unit:
            config["unit_of_measurement"] = unit
            config["state_class"] = "measurement"
        out[discovery.config("sensor", node, f"{base_id}_{key}")] = json.dumps(config).encode()
    return out
