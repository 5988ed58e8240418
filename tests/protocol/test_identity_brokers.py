"""Identity bound to the sender, against real brokers (issue 49, items 3 and 4).

* The brokers' rights (the embedded broker with ``edgeagent credentials``, Mosquitto with the generated
  ACL): a device login writes only topics with its own id in them; it cannot announce as another device
  and cannot publish stage outputs under another device's id.
* The receivers: a worker takes a stage's activations only from the device the plan says holds that
  stage, whatever broker carries them (here brokers without any ACL, where it is the only defence).
* Plain TCP beyond loopback: the broker refuses to listen there without ``insecure_plaintext``, and a
  client refuses to send its password there.

As in test_security.py, a forbidden publish is followed by an allowed marker on the same connection:
once the marker arrives, the forbidden message has been judged.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from edgeagent.broker import EmbeddedBroker, free_port
from edgeagent.broker.credentials import CredentialStore
from edgeagent.config import WorkerConfig
from edgeagent.errors import ConfigError
from edgeagent.modes import mode
from edgeagent.modes.pipeline.worker.session import PipelineSession
from edgeagent.protocol.limits import SENDER
from edgeagent.protocol.messages import Activation, Announce, Assign, Heartbeat, Ready
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode, encode
from edgeagent.roles.worker import Worker
from edgeagent.transport.mqtt import MqttTransport
from tests.conftest import MosquittoProcess
from tests.helpers import make_assign
from tests.protocol.test_security import CLUSTER, TOPICS, Client

TIMEOUT = 10.0


@pytest.fixture
def passwords(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    store = CredentialStore(tmp_path / "credentials")
    logins = {"central": store.add("central", role="central", cluster=CLUSTER)}
    for name in ("worker-1", "worker-2"):
        logins[name] = store.add(name, cluster=CLUSTER)
    logins["watcher"] = store.add("watcher", role="observer", cluster=CLUSTER)
    return store.directory, logins


@pytest.fixture(params=["amqtt", pytest.param("mosquitto", marks=pytest.mark.mosquitto)])
def secured_port(
    request: pytest.FixtureRequest, tmp_path: Path, passwords: tuple[Path, dict[str, str]]
) -> Iterator[int]:
    """A broker with the logins and rights of ``passwords``: the embedded one, or Mosquitto with the files
    ``edgeagent credentials`` generated."""
    directory, _ = passwords
    if request.param == "amqtt":
        with EmbeddedBroker("127.0.0.1", credentials=str(directory)) as broker:
            yield broker.port
        return
    if shutil.which("mosquitto") is None:
        pytest.skip("the mosquitto binary is not installed")
    extra = (
        f"user root\npassword_file {directory / 'mosquitto.passwd'}\nacl_file {directory / 'mosquitto.acl'}\n"
    )
    proc = MosquittoProcess(tmp_path, extra=extra, anonymous=False).start()
    try:
        yield proc.port
    finally:
        proc.stop()


def _assign(worker_list: list[str], points: list[int], model: dict[str, object]) -> Assign:
    return make_assign(
        run_id="run1", worker_list=worker_list, points=points, model=model, batches_per_epoch=10
    )


def test_a_device_writes_only_topics_with_its_own_id(
    secured_port: int, passwords: tuple[Path, dict[str, str]]
) -> None:
    _, pw = passwords
    clients = {
        name: Client(secured_port, f"ea-{CLUSTER}-{name}", name, pw[name])
        for name in ("central", "worker-1", "watcher")
    }
    try:
        assert all(c.connect() == 0 for c in clients.values())
        central, w1, watcher = clients["central"], clients["worker-1"], clients["watcher"]
        assert watcher.subscribe(TOPICS.all()) == 1
        # The plan gives worker-1 stage 1 (the embedded broker learns it; Mosquitto's rights are static).
        assign = _assign(["central", "worker-1", "worker-2"], [0, 1, 2, 3], {})
        central.publish(TOPICS.device(Family.CONTROL, "worker-1"), encode(assign, sender="central"))
        assert watcher.next()[0] == TOPICS.device(Family.CONTROL, "worker-1")

        forged = encode(Announce(device_id="worker-2"), sender="worker-2")
        w1.publish(TOPICS.device(Family.ANNOUNCE, "worker-2"), forged)  # announcing as worker-2
        w1.publish(TOPICS.device(Family.ANNOUNCE, "a-ghost"), forged)  # as a device nobody runs
        w1.publish(f"{TOPICS.base}/discovery/announce", forged)  # the shared topic of old
        w1.publish(TOPICS.gradients(1, "worker-2"), b"stage 1's, under worker-2's id")
        w1.publish(TOPICS.syncs(1, "worker-2"), b"stage 1's, under worker-2's id")
        w1.publish(f"{TOPICS.base}/stage/1/grad", b"the shared stage topic of old")
        own = encode(Announce(device_id="worker-1"), sender="worker-1")
        w1.publish(TOPICS.device(Family.ANNOUNCE, "worker-1"), own)
        w1.publish(TOPICS.gradients(1, "worker-1"), b"its own, of the stage it holds")
        assert [watcher.next() for _ in range(2)] == [
            (TOPICS.device(Family.ANNOUNCE, "worker-1"), own),
            (TOPICS.gradients(1, "worker-1"), b"its own, of the stage it holds"),
        ]
        assert watcher.received.empty()
    finally:
        for c in clients.values():
            c.close()


# -- the receivers -----------------------------------------------------------------------------


def wait_for(worker: Worker, done: Callable[[], bool], what: str) -> None:
    """Run the worker's loop (what arrives, then the work it made ready) until ``done()``: a bounded wait
    for an event, not a sleep."""
    deadline = time.monotonic() + TIMEOUT
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        worker._step()


def test_a_worker_takes_activations_only_from_the_device_that_holds_the_stage(
    broker_url: str, cluster: str
) -> None:
    """worker-2 holds stage 2 and takes stage 1's activations, which only worker-1 computes: an intruder
    (a device of the cluster that holds no stage) sending a batch of the right run, plan, shape and id
    is dropped and counted, and worker-2 trains on worker-1's batch."""
    topics = Topics(cluster)
    model = {"name": "mlp", "in_shape": [16], "num_classes": 4, "options": {"hidden": [32, 8]}}
    assign = _assign(["central", "worker-1", "worker-2"], [0, 1, 2, 3], model)
    worker = Worker(WorkerConfig(cluster=cluster, device_id="worker-2", broker=broker_url), modes=mode)
    others = {
        name: MqttTransport(broker_url, f"ea-{cluster}-{name}")
        for name in ("central", "worker-1", "intruder")
    }
    central = others["central"]
    replies: list[object] = []
    try:
        assert worker.transport.wait_connected(TIMEOUT)
        assert all(t.wait_connected(TIMEOUT) for t in others.values())
        central.subscribe(topics.device(Family.REPLY, "worker-2"), lambda _t, p: replies.append(decode(p)[1]))
        central.subscribe(
            topics.device(Family.HEARTBEAT, "worker-2"), lambda _t, p: replies.append(decode(p)[1])
        )
        worker.listen(topics.device(Family.CONTROL, "worker-2"))
        # A broker handles one client's packets in order: once a heartbeat the worker sent after subscribing
        # reaches the central node (whose subscriptions came first too), the worker's subscription is in.
        deadline = time.monotonic() + TIMEOUT
        while not any(isinstance(r, Heartbeat) for r in replies):
            assert time.monotonic() < deadline, "the subscriptions did not take effect"
            worker.send(topics.device(Family.HEARTBEAT, "worker-2"), Heartbeat(device_id="worker-2", seq=1))
            worker.pump(0.05)  # the retry interval; the loop itself waits for the heartbeat to arrive
        central.publish(topics.device(Family.CONTROL, "worker-2"), encode(assign, sender="central"))
        # Its Ready comes after its stage's subscriptions on the same connection.
        wait_for(worker, lambda: any(isinstance(r, Ready) for r in replies), "worker-2 to build its stage")
        session = worker.session
        assert isinstance(session, PipelineSession)
        run = session.run

        def batch(x: torch.Tensor) -> Activation:
            return Activation("run1", 0, 1, 0, 0, "train", x, torch.tensor([0, 1, 2, 3]))

        forged = batch(torch.full((4, 8), 1e3))
        intruder = others["intruder"]
        # Under its own id (a broker ACL lets a device write only that), for a stage it does not hold ...
        intruder.publish(topics.activations(1, "intruder"), encode(forged, sender="intruder"))
        # ... and on the shared stage topic of old, where any device could write any stage's batches.
        intruder.publish(f"{topics.base}/stage/1/act", encode(forged, sender="worker-1"))
        wait_for(worker, lambda: worker.gate.drops[SENDER] >= 1, "the forged batch to be dropped")
        assert run.forwards == {} and run.next_forward == 0
        real = batch(torch.zeros(4, 8))
        others["worker-1"].publish(topics.activations(1, "worker-1"), encode(real, sender="worker-1"))
        wait_for(worker, lambda: run.next_forward == 1, "worker-1's batch to be trained on")
        assert worker.gate.drops[SENDER] == 1
    finally:
        worker.leave_run()
        worker.transport.close()
        for t in others.values():
            t.close()


# -- plain TCP beyond loopback ------------------------------------------------------------------


def lan_address() -> str:
    """An address of this machine beyond loopback (the one its default route leaves from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent, only a route is chosen
        except OSError:
            pytest.skip("no network interface beyond loopback")
        address = str(s.getsockname()[0])
    if address.startswith("127."):
        pytest.skip("no network interface beyond loopback")
    return address


def test_plain_tcp_beyond_loopback_is_refused_unless_asked(passwords: tuple[Path, dict[str, str]]) -> None:
    directory, pw = passwords
    host = lan_address()
    with pytest.raises(ConfigError, match=r"beyond loopback, in plain TCP"):
        EmbeddedBroker(host, credentials=str(directory)).start()
    port = free_port(host)
    with EmbeddedBroker(host, port, credentials=str(directory), insecure_plaintext=True):
        url = f"mqtt://worker-1:{pw['worker-1']}@{host}:{port}"
        with pytest.raises(ConfigError, match=r"refusing to send the broker password of 'worker-1'"):
            MqttTransport(url, f"ea-{CLUSTER}-worker-1")
        asked = MqttTransport(url, f"ea-{CLUSTER}-worker-1", insecure_plaintext=True)
        try:
            assert asked.wait_connected(TIMEOUT)  # asked for in so many words: it connects
        finally:
            asked.close()
