"""Whole runs with an intruder: a device of the cluster, with its own login, that holds no stage and
forges what it can (issue 49, "Why" 3 and 4). Real brokers with per-device logins (the embedded one, and
Mosquitto with the files `edgeagent credentials` generated), worker processes, the central node here.

The intruder's forgeries are written the way a device could send them before the topics named their
sender (the shared ``discovery/announce`` and ``stage/<s>/grad``) and the way it can now (under its own id,
speaking for another device in the payload). None may change the run: no joiner, no announcement taken
for another device, no stage output of a stage it does not hold, nothing of it in the saved model.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from edgeagent.broker import EmbeddedBroker, free_port
from edgeagent.cli.demo import LocalWorkers, throwaway_logins
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.errors import TrainingError
from edgeagent.models import ModelSpec
from edgeagent.modes import mode
from edgeagent.modes.pipeline.central.run import PipelineRun
from edgeagent.protocol.commands import Collect
from edgeagent.protocol.messages import Announce, Gradient, Weights
from edgeagent.protocol.topics import Topics
from edgeagent.protocol.wire import decode, encode
from edgeagent.replication.store import seeded
from edgeagent.roles.central import Central
from tests.conftest import MosquittoProcess
from tests.integration.test_cli_errors import assert_user_error, run_cli
from tests.protocol.test_security import Client

pytestmark = pytest.mark.slow

FORGED = 1234.5  # every forged weight: easy to spot in a saved model
DEVICES = ["central", "worker-1", "worker-2", "intruder"]


@dataclass
class Secured:
    kind: str
    url: str
    files: dict[str, str]  # login -> its password file

    def password(self, login: str) -> str:
        return Path(self.files[login]).read_text(encoding="utf-8").strip()


@pytest.fixture(params=["amqtt", pytest.param("mosquitto", marks=pytest.mark.mosquitto)])
def secured(request: pytest.FixtureRequest, tmp_path: Path, cluster: str) -> Iterator[Secured]:
    credentials = tmp_path / "credentials"
    files = throwaway_logins(str(credentials), cluster, DEVICES, str(tmp_path))
    if request.param == "amqtt":
        with EmbeddedBroker("127.0.0.1", credentials=str(credentials)) as broker:
            yield Secured("amqtt", broker.url, files)
        return
    if shutil.which("mosquitto") is None:
        pytest.skip("the mosquitto binary is not installed")
    # pytest's temporary directories are 0700: stay root to read the files
    passwd, acl = credentials / "mosquitto.passwd", credentials / "mosquitto.acl"
    extra = f"user root\npassword_file {passwd}\nacl_file {acl}\n"
    proc = MosquittoProcess(tmp_path, extra=extra, anonymous=False).start()
    try:
        yield Secured("mosquitto", proc.url, files)
    finally:
        proc.stop()


class Intruder:
    """The intruder's connection (its own login and client id) and its forgeries, built from topic strings:
    the same forgeries work against a version whose topics did not name their sender."""

    def __init__(self, secured: Secured, cluster: str, spec: ModelSpec) -> None:
        self.base = Topics(cluster).base
        port = int(secured.url.rsplit(":", 1)[1])
        self.client = Client(port, f"ea-{cluster}-intruder", "intruder", secured.password("intruder"))
        assert self.client.connect() == 0
        # The last layer (always the last stage's, worker-2's) with every weight forged.
        self.tensors = {k: torch.full_like(v, FORGED) for k, v in seeded(spec, 0, [2]).items()}
        self.collects = 0
        self.client.client.on_message = self._on_command
        assert self.client.subscribe(f"{self.base}/run/command") == 1

    def publish(self, topic: str, message: Any, sender: str) -> None:
        self.client.publish(f"{self.base}/{topic}", encode(message, sender=sender))

    def forge_announcements(self) -> None:
        worker_2 = Announce(device_id="worker-2", slowdown=7.0, memory_limit=1.0)
        ghost = Announce(device_id="a-ghost")
        self.publish("device/worker-2/announce", worker_2, "worker-2")  # on worker-2's topic
        self.publish("device/a-ghost/announce", ghost, "a-ghost")  # on a ghost's topic
        self.publish("device/intruder/announce", worker_2, "intruder")  # on its own, naming worker-2
        self.publish("device/intruder/announce", ghost, "intruder")  # on its own, naming a ghost
        self.publish("discovery/announce", ghost, "intruder")  # the shared topic of old
        self.publish("discovery/announce", worker_2, "intruder")

    def forge_gradients(self, run_id: str, plan_id: int, batch: int) -> None:
        """Stage 1's gradients (worker-1's) for the batches in flight, to the central node."""
        for b in range(batch, batch + 4):
            grad = Gradient(
                run_id=run_id, plan_id=plan_id, stage=1, batch_id=b, g=torch.zeros(32, 32), loss=0.0
            )
            self.publish("stage/1/grad/intruder", grad, "intruder")  # its own id, not its stage
            self.publish("stage/1/grad", grad, "worker-1")  # the shared topic of old

    def _on_command(self, _client: Any, _userdata: Any, message: Any) -> None:
        """Answer the central node's ``collect`` (the trained model) before the real stages do."""
        _, command = decode(bytes(message.payload))
        if not isinstance(command, Collect):
            return
        self.collects += 1
        for device, topic in (
            ("worker-2", "device/worker-2/reply"),
            ("worker-2", "device/intruder/reply"),
            ("intruder", "device/intruder/reply"),
        ):
            sender = topic.split("/")[1]
            weights = Weights(
                run_id=command.run_id,
                device_id=device,
                stage=2,
                start=2,
                end=3,
                version=10**6,
                tensors=self.tensors,
            )
            self.client.client.publish(f"{self.base}/{topic}", encode(weights, sender=sender), qos=1)

    def close(self) -> None:
        self.client.close()


def test_an_intruder_changes_nothing(
    secured: Secured, cluster: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    model = "tests.integration.user_models:small_mlp"  # three layers: one per stage whatever the split
    train = TrainConfig(epochs=2, model=model)
    spec = ModelSpec(model, (1, 8, 8), 10)
    saved = tmp_path / "model.pt"
    config = CentralConfig(
        cluster=cluster,
        broker=secured.url,
        password_file=secured.files["central"],
        workers=2,
        train=train,
        progress=False,
        save_model=str(saved),
        repartition_first=5,
        repartition_every=10,
        startup_timeout=20,
        restart_window=0.0,
    )
    logins = {d: secured.files[d] for d in ("worker-1", "worker-2")}
    local = LocalWorkers(2, secured.url, cluster, [1.0, 1.0], logins=logins, allowed_models=[model])
    intruder = Intruder(secured, cluster, spec)
    forged_at: list[int] = []
    node: Central

    def progress(values: dict[str, Any]) -> None:
        # Once training runs (a joiner would be taken from now on), a few batches before a re-split.
        batch = values.get("batch")
        if isinstance(batch, int) and batch >= 3 and not forged_at and node.active is not None:
            forged_at.append(batch)
            intruder.forge_announcements()
            active = node.active
            assert isinstance(active, PipelineRun)
            intruder.forge_gradients(node.run_id, active.state.plan_id, batch)

    node = Central(config, progress=progress, modes=mode)
    local.start_all()
    try:
        report = node.run()
    finally:
        local.stop()
        intruder.close()
    assert forged_at and intruder.collects == 1
    assert report.epochs == 2 and report.recoveries == [] and report.final_accuracy > 0.5
    # No joiner, no announcement taken for another device.
    assert all(set(p.get("workers", [])) <= {"worker-1", "worker-2"} for p in report.partitions)
    assert isinstance(node.active, PipelineRun) and node.active.state.joiners == []
    assert "a-ghost" not in node.announced and "intruder" not in node.workers
    assert node.announced["worker-2"].slowdown == 1.0
    # Nothing of the intruder's in the trained model.
    state = torch.load(saved, map_location="cpu", weights_only=True)
    assert set(intruder.tensors) <= {f"layers.{k}" for k in state}, sorted(state)
    assert not any(torch.all(t == FORGED) for t in state.values())
    # Its stage-1 gradients: refused by the embedded broker (it holds no stage); Mosquitto's static ACL lets
    # a device write its own outputs of any stage, so there the central node drops them.
    if secured.kind == "amqtt":
        assert "refused intruder publishing to" in caplog.text and "stage/1/grad/intruder" in caplog.text
    else:
        assert "'intruder' does not hold stage 1" in caplog.text
    assert "speaks only for itself" in caplog.text  # the announcements and collects naming worker-2


# -- the allow-list of user models, with a real worker process ------------------------------------


@pytest.mark.parametrize("allowed", [False, True], ids=["not-allowed", "allowed"])
def test_a_worker_builds_a_user_model_only_from_its_allow_list(
    amqtt_url: str, cluster: str, allowed: bool
) -> None:
    model = "tests.integration.user_models:small_mlp"
    config = CentralConfig(
        cluster=cluster,
        broker=amqtt_url,
        workers=1,
        train=TrainConfig(epochs=1, model=model, max_batches=20),
        progress=False,
        startup_timeout=30,
    )
    local = LocalWorkers(1, amqtt_url, cluster, [1.0], allowed_models=[model] if allowed else [])
    local.start_all()
    try:
        if allowed:
            assert Central(config, modes=mode).run().batches >= 20
        else:
            with pytest.raises(TrainingError, match=r"worker-1 failed: model .*small_mlp.* allowed_models"):
                Central(config, modes=mode).run()
    finally:
        local.stop()


# -- secure on a LAN by default: the command lines -------------------------------------------------


def test_the_broker_refuses_plain_tcp_beyond_loopback_unless_asked(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    assert run_cli("credentials", "add", "--credentials-dir", str(creds), "pi-1").returncode == 0
    port = str(free_port("0.0.0.0"))
    proc = run_cli("broker", "--host", "0.0.0.0", "--port", port, "--credentials-dir", str(creds))
    assert_user_error(proc, "beyond loopback, in plain TCP", "--cert-file", "--insecure-plaintext")
    # Asked for: it listens, and says at once that it is insecure.
    args = [
        "broker",
        "--host",
        "0.0.0.0",
        "--port",
        port,
        "--credentials-dir",
        str(creds),
        "--insecure-plaintext",
    ]
    broker = subprocess.Popen([sys.executable, "-m", "edgeagent", *args], stderr=subprocess.PIPE, text=True)
    try:
        assert broker.stderr is not None
        for line in broker.stderr:  # until the warning: an event, not a sleep
            if "INSECURE" in line:
                break
        else:
            pytest.fail(f"the broker exited ({broker.wait()}) without warning about plain TCP")
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(30)


def test_a_worker_refuses_to_send_its_password_in_clear_beyond_loopback(tmp_path: Path) -> None:
    password = tmp_path / "pi-1.password"
    password.write_text("secret\n")
    proc = run_cli(
        "worker",
        "--device-id",
        "pi-1",
        "--broker",
        "mqtt://192.0.2.10:1883",
        "--password-file",
        str(password),
        "--once",
    )
    assert_user_error(
        proc,
        "refusing to send the broker password",
        "mqtts://192.0.2.10:8883",
        "--ca-file",
        "--insecure-plaintext",
    )
