"""Home Assistant discovery payloads point at edgeagent's own topics."""

from __future__ import annotations

import json

import pytest

from edgeagent.ops.homeassistant import check_prefix, discovery_configs
from edgeagent.protocol.topics import Topics, discovery_node_id

NODE = "homeassistant/sensor/edgeagent_lab"


def test_discovery_configs_for_one_device() -> None:
    topics = Topics("lab")
    configs = discovery_configs(topics, "pi-1")
    # The cluster's node id is a topic level of its own, so the broker can grant a cluster its configs.
    assert set(configs) == {
        f"{NODE}/edgeagent_lab_pi_1_{k}/config" for k in ("state", "stage", "throughput", "batches")
    }
    state = json.loads(configs[f"{NODE}/edgeagent_lab_pi_1_state/config"])
    assert state["state_topic"] == "edgeagent/v1/lab/device/pi-1/status"
    assert state["value_template"] == "{{ value_json.b.state }}"
    assert state["device"]["identifiers"] == ["edgeagent_lab_pi_1"]
    throughput = json.loads(configs[f"{NODE}/edgeagent_lab_pi_1_throughput/config"])
    assert throughput["state_topic"] == "edgeagent/v1/lab/device/pi-1/metrics"
    assert throughput["unit_of_measurement"] == "samples/s"
    assert discovery_configs(topics, "pi-1", prefix="ha").keys() != configs.keys()


def test_a_device_that_left_is_unavailable() -> None:
    """A clean shutdown ("left") makes the sensors unavailable, like the last will ("offline")."""
    state = json.loads(discovery_configs(Topics("lab"), "pi-1")[f"{NODE}/edgeagent_lab_pi_1_state/config"])
    template = state["availability_template"]
    assert "'offline'" in template and "'left'" in template


def test_node_ids_and_prefixes() -> None:
    assert discovery_node_id("lab.2") == "edgeagent_lab_2"  # Home Assistant's ids: [a-zA-Z0-9_-]
    assert discovery_node_id("pi-lab") == "edgeagent_pi-lab"
    assert check_prefix("homeassistant") == "homeassistant"
    assert check_prefix("site/ha") == "site/ha"
    for bad in ("", "#", "ha/+", "ha//x", "/ha", "ha/", "edgeagent", "edgeagent/v1/lab", "a/b/c/d/e"):
        with pytest.raises(ValueError, match="discovery prefix"):
            check_prefix(bad)
