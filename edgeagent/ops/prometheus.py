"""An optional Prometheus endpoint on the central node (``--prometheus-port``, off by default).

For those who run Prometheus and Grafana: the central node serves ``http://<host>:<port>/metrics`` with
the last metrics message of every device of its cluster (its own included), read from the same MQTT
topics a monitor reads (``device/+/metrics``), so what Grafana plots is what Home Assistant and
``edgeagent monitor`` show. Values are in Prometheus' base units (seconds, bytes, hertz); every series
has the labels ``cluster`` and ``device``. A scrape reads a snapshot: nothing is computed per scrape.

prometheus-client is in the ``[central]`` extra; it is imported only when the endpoint is asked for.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from edgeagent.errors import ConfigError, ProtocolError
from edgeagent.protocol.messages import Metrics
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode
from edgeagent.transport.base import Transport

log = logging.getLogger("edgeagent.ops.prometheus")

MIB = 1024 * 1024
# (metric name, help, where in ``values``, factor to base units)
GAUGES: tuple[tuple[str, str, tuple[str, ...], float], ...] = (
    ("edgeagent_loss", "Last training loss (central node)", ("loss",), 1.0),
    ("edgeagent_accuracy", "Test accuracy of the last epoch, 0-1 (central node)", ("accuracy",), 1.0),
    ("edgeagent_epoch", "Epoch in progress, from 0", ("epoch",), 1.0),
    ("edgeagent_batches", "Batches this device finished in the run", ("batches",), 1.0),
    ("edgeagent_samples_per_second", "Training throughput", ("samples_per_second",), 1.0),
    ("edgeagent_compute_seconds", "Time spent computing", ("compute_s",), 1.0),
    ("edgeagent_communication_seconds", "Time spent sending and receiving", ("communication_s",), 1.0),
    ("edgeagent_idle_seconds", "Time spent waiting (the pipeline bubble)", ("idle_s",), 1.0),
    ("edgeagent_wall_seconds", "Time since the device's run started", ("wall_s",), 1.0),
    ("edgeagent_compression_ratio", "Bytes sent over bytes uncompressed", ("compression_ratio",), 1.0),
    ("edgeagent_cpu_temperature_celsius", "CPU temperature", ("health", "cpu_temp_c"), 1.0),
    ("edgeagent_cpu_frequency_hertz", "CPU clock", ("health", "cpu_freq_mhz"), 1e6),
    ("edgeagent_throttled_flags", "The Pi firmware's get_throttled word", ("health", "throttled_raw"), 1.0),
    ("edgeagent_resident_memory_bytes", "The role's resident memory", ("health", "rss_mib"), MIB),
    ("edgeagent_memory_available_bytes", "Memory the board has free", ("health", "mem_available_mib"), MIB),
)


class ClusterCollector(Collector):
    """The last metrics of every device of one cluster, as Prometheus gauges."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self._latest: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def update(self, device_id: str, values: dict[str, Any]) -> None:
        with self._lock:
            self._latest[device_id] = values

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            latest = dict(self._latest)
        for name, help_text, path, factor in GAUGES:
            gauge = GaugeMetricFamily(name, help_text, labels=["cluster", "device"])
            for device, values in sorted(latest.items()):
                value = _at(values, path)
                if value is not None:
                    gauge.add_metric([self.cluster, device], value * factor)
            yield gauge


def _at(values: dict[str, Any], path: tuple[str, ...]) -> float | None:
    node: Any = values
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return float(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None


class PrometheusEndpoint:
    """Serves a cluster's metrics on ``port`` (all interfaces: Prometheus scrapes from another machine)
    while the central node runs; :meth:`close` stops it."""

    def __init__(self, transport: Transport, topics: Topics, port: int, *, address: str = "0.0.0.0") -> None:
        self.collector = ClusterCollector(topics.cluster)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector)
        try:
            self._server, self._thread = start_http_server(port, address, registry=registry)
        except OSError as exc:
            raise ConfigError(f"--prometheus-port {port}: cannot listen on {address}:{port}: {exc}") from exc
        self._topics = topics
        transport.subscribe(topics.devices(Family.METRICS), self._on_metrics)
        log.info("Prometheus metrics on http://%s:%d/metrics", address, port)

    def _on_metrics(self, topic: str, payload: bytes) -> None:
        try:
            device = self._topics.parse(topic).device
            _, msg = decode(payload)
        except ProtocolError as exc:
            log.debug("%s: not a metrics message: %s", topic, exc)
            return
        if isinstance(msg, Metrics) and device == msg.device_id:  # a device speaks for itself only
            self.collector.update(msg.device_id, msg.values)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
