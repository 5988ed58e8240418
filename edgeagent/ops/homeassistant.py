"""Optional Home Assistant MQTT discovery of each device's training status (off by default).

With ``--home-assistant`` the central node publishes, retained, one discovery config per device and
sensor under ``<prefix>/sensor/edgeagent_<cluster>/<object id>/config``; Home Assistant then reads the
states straight from edgeagent's own JSON status and metrics topics. Nothing else changes on the wire.
Every device gets its training state, stage, throughput and batches, and its health (CPU temperature and
clock, throttling, memory: :mod:`edgeagent.runtime.health`); the central node also the run's loss,
accuracy and epoch (:data:`SENSORS`).

The ``edgeagent_<cluster>`` level is Home Assistant's optional node id. It is there for the broker's
topic rights (:mod:`edgeagent.protocol.acl`): a cluster's central login may publish discovery configs
of its own node only, so it cannot rewrite the configs of the other things in the house.
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Sensor:
    """One Home Assistant entity of a device, read from the device's own status or metrics JSON.

    ``path`` is where the value sits in the message body (``("values", "health", "cpu_temp_c")``); a
    value the message lacks (a board without a thermal zone, a loss before the first batch) renders as
    ``None``, which Home Assistant shows as *unknown*. ``name`` is the entity's own name only: Home
    Assistant puts the device's name before it.
    """

    key: str
    name: str
    family: Family
    path: tuple[str, ...]
    unit: str | None = None
    device_class: str | None = None
    state_class: str | None = None
    scale: float = 1.0
    digits: int | None = None
    component: str = "sensor"
    numeric: bool = True  # False: a word (the training state), shown as it is
    central_only: bool = False  # the run's figures (loss, accuracy, epoch): on the central node's metrics

    def template(self) -> str:
        """The Jinja value template: the value at ``path`` (scaled, rounded), else None."""
        get = "value_json.b" + "".join(f".get('{k}', {{}})" for k in self.path[:-1])
        get += f".get('{self.path[-1]}')"
        if self.component == "binary_sensor":  # the Pi's "now" throttling bits: 0-3
            return f"{{% set v = {get} %}}{{{{ None if v is not number else ('ON' if v % 16 else 'OFF') }}}}"
        if not self.numeric:
            return f"{{{{ {get} }}}}"
        value = "v" if self.scale == 1.0 else f"v * {self.scale:g}"
        if self.digits is not None:
            value = f"({value}) | round({self.digits})"
        return f"{{% set v = {get} %}}{{{{ {value} if v is number else None }}}}"


_M = Family.METRICS
_HEALTH = ("values", "health")
SENSORS: tuple[Sensor, ...] = (
    Sensor("state", "Training state", Family.STATUS, ("state",), numeric=False),
    Sensor("stage", "Pipeline stage", Family.STATUS, ("stage",)),
    Sensor(
        "throughput",
        "Throughput",
        _M,
        ("values", "samples_per_second"),
        "samples/s",
        state_class="measurement",
        digits=1,
    ),
    Sensor("batches", "Batches", _M, ("values", "batches"), state_class="total_increasing"),
    Sensor("loss", "Loss", _M, ("values", "loss"), state_class="measurement", digits=4, central_only=True),
    Sensor(
        "accuracy",
        "Accuracy",
        _M,
        ("values", "accuracy"),
        "%",
        state_class="measurement",
        scale=100,
        digits=2,
        central_only=True,
    ),
    Sensor("epoch", "Epoch", _M, ("values", "epoch"), central_only=True),
    Sensor(
        "cpu_temperature",
        "CPU temperature",
        _M,
        (*_HEALTH, "cpu_temp_c"),
        "°C",
        device_class="temperature",
        state_class="measurement",
    ),
    Sensor(
        "cpu_clock",
        "CPU clock",
        _M,
        (*_HEALTH, "cpu_freq_mhz"),
        "MHz",
        device_class="frequency",
        state_class="measurement",
    ),
    Sensor(
        "throttled",
        "Throttled",
        _M,
        (*_HEALTH, "throttled_raw"),
        device_class="problem",
        component="binary_sensor",
    ),
    Sensor(
        "memory_used",
        "Memory used",
        _M,
        (*_HEALTH, "rss_mib"),
        "MiB",
        device_class="data_size",
        state_class="measurement",
    ),
    Sensor(
        "memory_available",
        "Memory available",
        _M,
        (*_HEALTH, "mem_available_mib"),
        "MiB",
        device_class="data_size",
        state_class="measurement",
    ),
)


def sensors_of(*, central: bool) -> tuple[Sensor, ...]:
    """The sensors of a device: the run's figures only on the central node."""
    return tuple(s for s in SENSORS if central or not s.central_only)


def discovery_configs(
    topics: Topics, device_id: str, *, prefix: str = DEFAULT_PREFIX, central: bool = False
) -> dict[str, bytes]:
    """Topic -> retained JSON payload for each sensor of one device (``central``: the central node, whose
    metrics carry the run's loss, accuracy and epoch)."""
    node = discovery_node_id(topics.cluster)
    discovery = DiscoveryTopics(prefix)
    base_id = f"edgeagent_{topics.cluster}_{device_id}".replace("-", "_").replace(".", "_")
    out = {}
    for sensor in sensors_of(central=central):
        config: dict[str, Any] = {
            "name": sensor.name,
            "unique_id": f"{base_id}_{sensor.key}",
            "state_topic": topics.device(sensor.family, device_id),
            "value_template": sensor.template(),
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
            "origin": {"name": "edgeagent", "sw_version": _version()},
        }
        for key in ("unit", "device_class", "state_class"):
            value = getattr(sensor, key)
            if value is not None:
                config["unit_of_measurement" if key == "unit" else key] = value
        if sensor.key in ("cpu_temperature", "cpu_clock", "throttled", "memory_used", "memory_available"):
            config["entity_category"] = "diagnostic"
        out[discovery.config(sensor.component, node, f"{base_id}_{sensor.key}")] = json.dumps(config).encode()
    return out


def _version() -> str:
    try:
        return importlib.metadata.version("edgeagent")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
