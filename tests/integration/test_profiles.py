"""Device profiles pushed from the central node to real worker processes over a real broker."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.ops import profiles
from edgeagent.protocol.messages import Metrics, Profile, Status
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode, encode
from edgeagent.transport.mqtt import MqttTransport

pytestmark = pytest.mark.slow


class Watch:
    """Collects worker-1's statuses and metrics as they arrive."""

    def __init__(self, url: str, topics: Topics) -> None:
        self.statuses: list[Status] = []
        self.metrics: list[Metrics] = []
        self.changed = threading.Condition()
        self.transport = MqttTransport(url, f"watch-{topics.cluster}")
        self.transport.subscribe(topics.device(Family.STATUS, "worker-1"), self._on)
        self.transport.subscribe(topics.device(Family.METRICS, "worker-1"), self._on)
        assert self.transport.wait_connected(10)

    def _on(self, topic: str, payload: bytes) -> None:
        _, msg = decode(payload)
        with self.changed:
            if isinstance(msg, Status):
                self.statuses.append(msg)
            elif isinstance(msg, Metrics):
                self.metrics.append(msg)
            self.changed.notify_all()

    def wait_for(self, predicate: Any, timeout: float = 30.0) -> bool:
        with self.changed:
            return self.changed.wait_for(predicate, timeout)


def test_pushed_profile_changes_a_running_worker_and_a_broken_one_is_rejected(
    amqtt_url: str, cluster: str
) -> None:
    topics = Topics(cluster)
    watch = Watch(amqtt_url, topics)
    pusher = MqttTransport(amqtt_url, f"pusher-{cluster}")
    assert pusher.wait_connected(10)
    outcome: dict[str, bool] = {}

    def progress(values: dict[str, Any]) -> None:
        if values.get("batch") == 20 and "live" not in outcome:
            # Slowdown and compression of its outgoing activations change in the running worker.
            live = profiles.DeviceProfile(id="worker-1", slowdown=3.0, metrics_interval=0.2, compression="2")
            profiles.push(pusher, topics, [live])
            outcome["live"] = watch.wait_for(
                lambda: any(m.values.get("slowdown") == 3.0 for m in watch.metrics)
            )
        if values.get("batch") == 60 and "broken" not in outcome:
            broken = Profile(
                device_id="worker-1", settings={"id": "worker-1", "slowdown": "fast"}, digest="bad"
            )
            pusher.publish(
                topics.device(Family.PROFILE, "worker-1"), encode(broken, sender="test"), retain=True
            )
            outcome["broken"] = watch.wait_for(
                lambda: any("profile rejected" in s.detail and "slowdown" in s.detail for s in watch.statuses)
            )

    try:
        config = CentralConfig(cluster=cluster, train=TrainConfig(epochs=3), progress=False)
        report = run_demo(
            config, workers=2, slowdowns=[], broker=amqtt_url, show_progress=False, on_progress=progress
        )
    finally:
        pusher.close()
        watch.transport.close()
    assert outcome == {"live": True, "broken": True}
    # Applied without a restart (the same run), and the broken profile kept the last good one:
    assert report.epochs == 3 and report.final_accuracy > 0.6
    assert watch.metrics[-1].values["slowdown"] == 3.0
    # From batch 20 on worker-1 sent 2-bit activations (its gradients stay raw: the run compresses
    # nothing), so over everything it sent the ratio approaches (1 + 1) / (1/16 + 1) ~ 1.9.
    assert watch.metrics[-1].values["compression_ratio"] > 1.3


def test_a_worker_that_starts_after_the_push_gets_the_retained_profile(amqtt_url: str, cluster: str) -> None:
    topics = Topics(cluster)
    pusher = MqttTransport(amqtt_url, f"pusher-{cluster}")
    assert pusher.wait_connected(10)
    profile = profiles.DeviceProfile(id="worker-1", slowdown=2.0)
    profiles.push(pusher, topics, [profile])
    pusher.close()
    watch = Watch(amqtt_url, topics)
    try:
        config = CentralConfig(cluster=cluster, train=TrainConfig(epochs=2), progress=False)
        report = run_demo(config, workers=2, slowdowns=[], broker=amqtt_url, show_progress=False)
    finally:
        watch.transport.close()
    assert report.epochs == 2
    assert any(s.detail.startswith(f"profile {profile.digest()} applied") for s in watch.statuses)
    assert watch.metrics and watch.metrics[-1].values["slowdown"] == 2.0
    assert watch.metrics[-1].values["profile"] == profile.digest()
