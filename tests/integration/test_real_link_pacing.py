"""Replicas paced on a real slow uplink: a worker in a network namespace behind a ``tc tbf`` rate limit.

worker-1 (stage 1) runs in a namespace of its own joined by a veth pair whose namespace end sends at
4 Mbit/s; the central node, worker-2 and a Mosquitto (listening on loopback and on the pair's host end)
run here. No ``--link-mbps`` anywhere: the link probes measure worker-1's uplink below
``replica_pace_mbps``, the central node says so (``pace``), and worker-1 sends every replica once, on its
replica topic, in its uplink's idle time: a global replica arrives there (unpaced, it goes to the reply
topic). worker-2's uplink (loopback) is not paced. Root only (namespaces, ``tc``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeagent.broker import free_port
from edgeagent.broker.mosquitto import MosquittoProcess
from edgeagent.cli.demo import worker_command
from edgeagent.config import TrainConfig
from edgeagent.protocol.messages import Event, Weights
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode
from edgeagent.transport.mqtt import MqttTransport
from tests.helpers import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.netlab import NetnsLink, add_link, in_netns, remove_link, shape

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc") and shutil.which("mosquitto")),
        reason="needs root, iproute2 (ip, tc) and mosquitto",
    ),
]

UPLINK_MBPS = 4.0
# A replica of worker-1's stage (weights and momentum, 132 kB) takes about 50 batches to cross a link the
# activations and gradients keep busy (the lane then gets a third of its 25 % share), whatever the rate:
# the first one, of batch 30, is in by about batch 80; the run goes on to 180.
BATCHES = 180
_N = os.getpid() % 200 + 20
LINK = NetnsLink(f"eapace{_N}", f"eaph{_N}", f"eapn{_N}", f"10.233.{_N}.2/30", host_addr=f"10.233.{_N}.1/30")
HOST_IP = f"10.233.{_N}.1"


@pytest.fixture
def slow_link() -> Iterator[NetnsLink]:
    remove_link(LINK)  # what a crashed run left
    add_link(LINK)
    try:
        shape(LINK.ns_if, mbps=UPLINK_MBPS, ns=LINK.ns)
        yield LINK
    finally:
        remove_link(LINK)


class _Observer:
    """Every event, and worker-1's replicas by topic and purpose, as a monitor would see them."""

    def __init__(self, url: str, topics: Topics) -> None:
        self.paced: list[dict[str, object]] = []
        self.global_on_replica_topic = threading.Event()
        self.transport = MqttTransport(url, f"observer-{os.getpid()}")
        assert self.transport.wait_connected(10)
        self.transport.subscribe(topics.fixed(Family.EVENTS), self._event)
        self.transport.subscribe(topics.device(Family.REPLICA, "worker-1"), self._replica)

    def _event(self, topic: str, payload: bytes) -> None:
        _, msg = decode(payload)
        if isinstance(msg, Event) and msg.name == "replicas-paced":
            self.paced.append(dict(msg.details))

    def _replica(self, topic: str, payload: bytes) -> None:
        _, msg = decode(payload)
        if isinstance(msg, Weights) and msg.purpose == "global":
            self.global_on_replica_topic.set()


def test_a_real_slow_uplink_is_measured_and_its_replicas_paced(slow_link: NetnsLink, tmp_path: Path) -> None:
    port = free_port()
    extra = f"listener {port} {HOST_IP}\n"  # worker-1's way in, across the shaped pair
    with MosquittoProcess(tmp_path, extra=extra) as broker:
        train = TrainConfig(epochs=5, max_batches=BATCHES)
        cluster = LocalCluster(
            broker.url,
            workers=2,
            start=False,
            train=train,
            chain_every=30,  # every replica a global one too: none supersedes a global one still waiting
            global_every=30,
        )
        observer = _Observer(broker.url, Topics(cluster.config.cluster))
        try:
            slow = in_netns(
                slow_link.ns,
                *worker_command("worker-1", f"mqtt://{HOST_IP}:{port}", cluster.config.cluster, 1.0),
            )
            cluster.local.procs["worker-1"] = subprocess.Popen(slow, env=cluster.local.env)
            cluster.local.start("worker-2")
            report = cluster.run()
        finally:
            observer.transport.close()
    assert report.batches == BATCHES
    # The probes measured worker-1's uplink at about its rate, worker-2's far above the threshold.
    (paced,) = observer.paced
    uplinks = paced["uplinks"]
    assert isinstance(uplinks, dict) and set(uplinks) == {"worker-1"}, uplinks
    assert 0.5 * UPLINK_MBPS < float(uplinks["worker-1"]) < 1.5 * UPLINK_MBPS, uplinks
    assert paced["share"] == cluster.config.replica_share
    # worker-1 took the pace: its global replicas come once, on its replica topic.
    assert observer.global_on_replica_topic.is_set()
