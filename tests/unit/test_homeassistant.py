"""Home Assistant discovery payloads point at edgeagent's own topics."""

from __future__ import annotations

import json

from edgeagent.homeassistant import discovery_configs
from edgeagent.protocol.topics import Topics


def test_discovery_configs_for_one_device() -> None:
    topics = Topics("lab")
    configs = discovery_configs(topics, "pi-1")
    assert set(configs) == {
        f"homeassistant/sensor/edgeagent_lab_pi_1_{k}/config"
        for k in ("state", "stage", "throughput", "batches")
    }
    state = json.loads(configs["homeassistant/sensor/edgeagent_lab_pi_1_state/config"])
    assert state["state_topic"] == "edgeagent/v1/lab/device/pi-1/status"
    assert state["value_template"] == "{{ value_json.b.state }}"
    assert state["device"]["identifiers"] == ["edgeagent_lab_pi_1"]
    throughput = json.loads(configs["homeassistant/sensor/edgeagent_lab_pi_1_throughput/config"])
    assert throughput["state_topic"] == "edgeagent/v1/lab/device/pi-1/metrics"
    assert throughput["unit_of_measurement"] == "samples/s"
    assert discovery_configs(topics, "pi-1", prefix="ha").keys() != configs.keys()
