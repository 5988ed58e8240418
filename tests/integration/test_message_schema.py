"""The JSON messages of a real run (embedded broker, central + 2 workers) against the published schema."""

from __future__ import annotations

import json
import threading
from collections import Counter
from importlib.resources import files
from typing import Any

import jsonschema
import pytest

from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.protocol.topics import Family, Topics
from edgeagent.transport.mqtt import MqttTransport

pytestmark = pytest.mark.slow

SCHEMA = json.loads((files("edgeagent") / "share/schema/messages.v1.schema.json").read_text())
FAMILIES = (Family.STATUS, Family.HEARTBEAT, Family.METRICS, Family.EVENTS)


def test_schema_rejects_what_it_should() -> None:
    """The schema is not a rubber stamp: a wrong version, a string temperature, an unknown state fail."""
    validator = jsonschema.Draft202012Validator(SCHEMA)
    good = {"v": 1, "k": "metrics", "s": "pi-1", "b": {"device_id": "pi-1", "values": {"health": {}}}}
    validator.validate(good)
    bad_version = {**good, "v": 2}
    bad_health = {**good, "b": {"device_id": "pi-1", "values": {"health": {"cpu_temp_c": "hot"}}}}
    bad_state = {"v": 1, "k": "status", "s": "pi-1", "b": {"device_id": "pi-1", "state": "napping"}}
    for bad in (bad_version, bad_health, bad_state):
        assert not validator.is_valid(bad), bad


def test_a_real_runs_messages_match_the_schema(amqtt_url: str, cluster: str) -> None:
    topics = Topics(cluster)
    captured: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    def on_message(topic: str, payload: bytes) -> None:
        with lock:
            captured.append((topic, payload))

    monitor = MqttTransport(amqtt_url, f"schema-{cluster}")
    for family in FAMILIES[:3]:
        monitor.subscribe(topics.devices(family), on_message)
    monitor.subscribe(topics.fixed(Family.EVENTS), on_message)
    try:
        assert monitor.wait_connected(10)
        train = TrainConfig(epochs=2, max_batches=30)
        config = CentralConfig(cluster=cluster, train=train, progress=False, metrics_interval=0.2)
        run_demo(config, workers=2, slowdowns=[], broker=amqtt_url, show_progress=False)
    finally:
        monitor.close()

    validator = jsonschema.Draft202012Validator(SCHEMA)
    kinds: Counter[str] = Counter()
    health_of: set[str] = set()
    for topic, payload in captured:
        message: dict[str, Any] = json.loads(payload)
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(message)]
        assert not errors, f"{topic}: {errors}\n{message}"
        kinds[message["k"]] += 1
        if message["k"] == "metrics":
            assert "rss_mib" in message["b"]["values"]["health"]  # every Linux has /proc
            health_of.add(message["s"])
    assert set(kinds) == {"status", "heartbeat", "metrics", "event"}, kinds
    assert health_of == {"central", "worker-1", "worker-2"}
