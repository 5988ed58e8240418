"""Home Assistant discovery payloads point at edgeagent's own topics, and their templates read real bodies."""

from __future__ import annotations

import json
from typing import Any

import jinja2
import pytest

from edgeagent.ops.homeassistant import SENSORS, check_prefix, discovery_configs, sensors_of
from edgeagent.protocol.topics import Topics, discovery_node_id

NODE = "homeassistant/sensor/edgeagent_lab"
BASE = ("state", "stage", "throughput", "batches", "cpu_temperature", "cpu_clock", "memory_used")


def render(config: dict[str, Any], body: dict[str, Any]) -> str:
    """What Home Assistant's template engine (Jinja2) makes of a message, ``value_json`` being its JSON."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    return env.from_string(config["value_template"]).render(value_json={"v": 1, "b": body})


def test_discovery_configs_for_one_device() -> None:
    topics = Topics("lab")
    configs = discovery_configs(topics, "pi-1")
    # The cluster's node id is a topic level of its own, so the broker can grant a cluster its configs.
    assert {f"{NODE}/edgeagent_lab_pi_1_{k}/config" for k in (*BASE, "memory_available")} < set(configs)
    assert "homeassistant/binary_sensor/edgeagent_lab/edgeagent_lab_pi_1_throttled/config" in configs
    assert not any(k in t for t in configs for k in ("_loss/", "_accuracy/", "_epoch/"))  # the run's: central
    state = json.loads(configs[f"{NODE}/edgeagent_lab_pi_1_state/config"])
    assert state["state_topic"] == "edgeagent/v1/lab/device/pi-1/status"
    assert state["name"] == "Training state"  # Home Assistant prefixes the device's name
    assert state["device"]["identifiers"] == ["edgeagent_lab_pi_1"]
    throughput = json.loads(configs[f"{NODE}/edgeagent_lab_pi_1_throughput/config"])
    assert throughput["state_topic"] == "edgeagent/v1/lab/device/pi-1/metrics"
    assert throughput["unit_of_measurement"] == "samples/s"
    temp = json.loads(configs[f"{NODE}/edgeagent_lab_pi_1_cpu_temperature/config"])
    assert (temp["device_class"], temp["state_class"], temp["unit_of_measurement"]) == (
        "temperature",
        "measurement",
        "°C",
    )
    assert discovery_configs(topics, "pi-1", prefix="ha").keys() != configs.keys()
    central = discovery_configs(topics, "central", central=True)
    assert len(central) == len(SENSORS) == len(sensors_of(central=False)) + 3


def test_no_name_repeats_the_device() -> None:
    for payload in discovery_configs(Topics("lab"), "pi-1", central=True).values():
        config = json.loads(payload)
        assert "pi-1" not in config["name"] and "edgeagent" not in config["name"].lower()


def test_templates_read_a_body_and_say_none_for_what_it_lacks() -> None:
    configs = {
        json.loads(p)["unique_id"].removeprefix("edgeagent_lab_central_"): json.loads(p)
        for p in discovery_configs(Topics("lab"), "central", central=True).values()
    }
    values = {
        "batches": 131,
        "epoch": 2,
        "samples_per_second": 1482.44,
        "loss": 0.461234,
        "accuracy": 0.8612,
        "health": {"cpu_temp_c": 61.2, "throttled_raw": 0x50005, "rss_mib": 200.5},
    }
    body = {"device_id": "central", "values": values}
    assert render(configs["throughput"], body) == "1482.4"
    assert render(configs["loss"], body) == "0.4612"
    assert render(configs["accuracy"], body) == "86.12"
    assert render(configs["epoch"], body) == "2"
    assert render(configs["cpu_temperature"], body) == "61.2"
    assert render(configs["throttled"], body) == "ON"
    assert render(configs["memory_used"], body) == "200.5"
    assert render(configs["throttled"], {"values": {"health": {"throttled_raw": 0x50000}}}) == "OFF"
    # Home Assistant shows "None" as unknown: a board without the field, a loss not yet known.
    bare = {"device_id": "central", "values": {"loss": None}}
    for key in ("loss", "accuracy", "cpu_temperature", "cpu_clock", "throttled", "memory_available"):
        assert render(configs[key], bare) == "None", key
    assert render(configs["state"], {"state": "training"}) == "training"


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
