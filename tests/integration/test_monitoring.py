"""What a user sees with `mosquitto_sub -v -t 'edgeagent/#'` during a real run."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from typing import Any

import jinja2
import pytest

from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.protocol.messages import Heartbeat, Metrics, Status
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode
from edgeagent.transport.mqtt import MqttTransport

pytestmark = pytest.mark.slow

METRIC_KEYS = {
    "stage",
    "batches",
    "samples_per_second",
    "compute_s",
    "communication_s",
    "idle_s",
    "wall_s",
    "compression_ratio",
    "slowdown",
    "link_mbps",
}


def test_heartbeats_metrics_and_status_of_every_device_are_readable(broker_url: str, cluster: str) -> None:
    topics = Topics(cluster)
    seen: dict[str, dict[Family, list[object]]] = defaultdict(lambda: defaultdict(list))
    raw: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    def on_message(topic: str, payload: bytes) -> None:
        with lock:
            raw.append((topic, payload))

    monitor = MqttTransport(broker_url, f"monitor-{cluster}")
    monitor.subscribe("edgeagent/#", on_message)
    try:
        assert monitor.wait_connected(10)
        config = CentralConfig(
            cluster=cluster, train=TrainConfig(epochs=3), progress=False, metrics_interval=0.5
        )
        report = run_demo(config, workers=2, slowdowns=[1, 1, 2], broker=broker_url, show_progress=False)
    finally:
        monitor.close()
    assert report.epochs == 3

    for topic, payload in raw:
        if not topic.startswith(topics.base + "/"):
            continue  # another test's cluster on the same broker
        info = topics.parse(topic)
        if info.family in (Family.HEARTBEAT, Family.METRICS, Family.STATUS):
            # Documented as JSON: readable without edgeagent.
            body = json.loads(payload)
            assert body["v"] == 1 and body["k"] == info.family.value.split("/")[-1]
            _, msg = decode(payload)
            assert info.device is not None
            seen[info.device][info.family].append(msg)
    for device in ("central", "worker-1", "worker-2"):
        families = seen[device]
        assert families[Family.HEARTBEAT], f"no heartbeat from {device}"
        assert families[Family.STATUS], f"no status from {device}"
        assert families[Family.METRICS], f"no metrics from {device}"
        assert all(isinstance(m, Heartbeat) and m.device_id == device for m in families[Family.HEARTBEAT])
        assert any(isinstance(m, Status) and m.state == "training" for m in families[Family.STATUS])
        metrics = [m for m in families[Family.METRICS] if isinstance(m, Metrics)]
        assert set(metrics[-1].values) >= METRIC_KEYS, metrics[-1].values
        assert metrics[-1].values["batches"] > 0
    worker2 = [m for m in seen["worker-2"][Family.METRICS] if isinstance(m, Metrics)][-1]
    assert worker2.values["slowdown"] == 2.0
    central = [m for m in seen["central"][Family.METRICS] if isinstance(m, Metrics)][-1]
    assert central.values["points"] == report.partitions[-1]["points"]


def test_home_assistant_discovery_when_asked(amqtt_url: str, cluster: str) -> None:
    """Home Assistant's view of a real run: every discovery config, and its template rendered (Jinja2, as
    Home Assistant does) against the last message on its state topic."""
    configs: dict[str, dict[str, Any]] = {}
    last: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def on_config(topic: str, payload: bytes) -> None:
        with lock:
            configs[topic] = json.loads(payload)

    def on_state(topic: str, payload: bytes) -> None:
        with lock:
            last[topic] = json.loads(payload)

    ha = MqttTransport(amqtt_url, f"ha-{cluster}")
    ha.subscribe("homeassistant/+/+/+/config", on_config)  # what Home Assistant subscribes to
    ha.subscribe(Topics(cluster).devices(Family.METRICS), on_state)
    ha.subscribe(Topics(cluster).devices(Family.STATUS), on_state)
    try:
        assert ha.wait_connected(10)
        config = CentralConfig(
            cluster=cluster, train=TrainConfig(epochs=1), progress=False, home_assistant=True
        )
        run_demo(config, workers=2, slowdowns=[], broker=amqtt_url, show_progress=False)
    finally:
        ha.close()
    node = f"edgeagent_{cluster}"
    shown: dict[tuple[str, str], str] = {}
    for topic, discovery in configs.items():
        if f"/{node}/" not in topic:
            continue  # another test's cluster
        device = discovery["unique_id"].removeprefix(f"{node}_")
        body = last[discovery["state_topic"]]
        value = jinja2.Environment().from_string(discovery["value_template"]).render(value_json=body)
        shown[device, discovery["name"]] = value
    for device in ("central", "worker_1", "worker_2"):
        assert (f"{device}_state", "Training state") in shown, sorted(shown)
        assert float(shown[f"{device}_batches", "Batches"]) > 0
        assert float(shown[f"{device}_memory_used", "Memory used"]) > 0  # every Linux has /proc
    assert 0 < float(shown["central_loss", "Loss"]) < 10
    assert 0 < float(shown["central_accuracy", "Accuracy"]) <= 100
    assert shown["central_epoch", "Epoch"] == "0"
    assert ("worker_1_loss", "Loss") not in shown
