"""`--prometheus-port`: Prometheus scrapes the central node during a real run (embedded broker, 2 workers)."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgeagent.broker import free_port
from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig

pytestmark = pytest.mark.slow

DEVICES = {"central", "worker-1", "worker-2"}


def scrape(port: int) -> dict[tuple[str, str], float]:
    """(metric, device) -> value of one scrape, as Prometheus reads the text format."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, sample.labels["device"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "device" in sample.labels
    }


def test_prometheus_scrapes_every_device_during_a_run(amqtt_url: str, cluster: str) -> None:
    port = free_port()
    scrapes: list[dict[tuple[str, str], float]] = []

    def on_progress(values: dict[str, Any]) -> None:
        """Scrape at every batch of the run until every device has reported batches and the loss is in."""
        if scrapes and _complete(scrapes[-1]):
            return
        scrapes.append(scrape(port))

    config = CentralConfig(
        cluster=cluster,
        train=TrainConfig(epochs=3),
        progress=False,
        metrics_interval=0.1,
        prometheus_port=port,
    )
    run_demo(config, workers=2, slowdowns=[], broker=amqtt_url, show_progress=False, on_progress=on_progress)
    assert scrapes, "no batch ran"
    seen = scrapes[-1]
    assert _complete(seen), sorted(seen)
    assert seen["edgeagent_loss", "central"] > 0
    assert seen["edgeagent_samples_per_second", "worker-1"] > 0
    assert seen["edgeagent_resident_memory_bytes", "worker-2"] > 1024 * 1024  # health, in bytes
    assert ("edgeagent_loss", "worker-1") not in seen  # a worker's metrics carry no loss
    # The endpoint ends with the run: the port is free again.
    with pytest.raises(OSError):
        scrape(port)


def _complete(seen: dict[tuple[str, str], float]) -> bool:
    return ("edgeagent_loss", "central") in seen and all(
        seen.get(("edgeagent_batches", d), 0) > 0 for d in DEVICES
    )
