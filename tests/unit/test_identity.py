"""Identity bound to the sender, without a broker: what a receiver takes from whom, which models a worker
builds, and where a password may travel in clear (issue 49, items 3 and 4).

The same defences against real brokers and processes: tests/protocol/test_identity_brokers.py and
tests/integration/test_identity_runs.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from edgeagent.broker import broker_config
from edgeagent.config import CentralConfig, WorkerConfig, build, load_yaml, model_path
from edgeagent.errors import ConfigError
from edgeagent.modes import mode
from edgeagent.protocol.identity import PlanView, StageSenders, identity_problem
from edgeagent.protocol.limits import SENDER
from edgeagent.protocol.messages import (
    Activation,
    Announce,
    Assign,
    ErrorReport,
    FetchRequest,
    Gradient,
    GradSync,
    Heartbeat,
    Message,
    Ready,
    Weights,
)
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode, encode
from edgeagent.roles.worker import Worker
from edgeagent.runtime.role import Role
from edgeagent.transport.hosts import is_loopback
from edgeagent.transport.memory import MemoryBroker, MemoryTransport
from edgeagent.transport.mqtt import BrokerUrl
from tests.helpers import make_assign

T = Topics("id")
X, Y = torch.zeros(2, 4), torch.tensor([0, 1])


def tiny_model(in_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """A user model (``tests.unit.test_identity:tiny_model``) for the allow-list."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_shape[-1], 8), nn.ReLU(), nn.Linear(8, num_classes))


TINY = "tests.unit.test_identity:tiny_model"


def collect(device: str, stage: int = 2) -> Weights:
    weight = torch.full((10, 8), 1234.5)
    return Weights(
        run_id="r",
        device_id=device,
        stage=stage,
        start=3,
        end=4,
        version=9,
        tensors={"layers.3.weight": weight},
    )


# -- the payload speaks only for its topic's device ----------------------------------------------


@pytest.mark.parametrize(
    ("topic", "sender", "message", "why"),
    [
        # device login w1 announcing as w2, or as a ghost, on its own topic
        (T.device(Family.ANNOUNCE, "w1"), "w1", Announce(device_id="w2"), "announce.device_id 'w2'"),
        (T.device(Family.ANNOUNCE, "w1"), "w1", Announce(device_id="a-ghost"), "a-ghost"),
        (T.device(Family.ANNOUNCE, "w2"), "w1", Announce(device_id="w2"), "sender 'w1'"),
        # answering for another device: collect, ready, error
        (T.device(Family.REPLY, "w1"), "w1", collect("w2"), "weights.device_id 'w2'"),
        (
            T.device(Family.REPLY, "w1"),
            "w1",
            Ready(run_id="r", plan_id=0, device_id="w2", stage=2, parameters=1),
            "ready.device_id 'w2'",
        ),
        (
            T.device(Family.REPLY, "w1"),
            "w1",
            ErrorReport(device_id="w2", code="compute", reason="x", run_id="r"),
            "error.device_id 'w2'",
        ),
        (
            T.device(Family.REQUEST, "w1"),
            "w1",
            FetchRequest(run_id="r", plan_id=1, requester="w2", owner="w3", layers=[1]),
            "fetch.requester 'w2'",
        ),
        # a stage output under another device's id, or of another stage than its topic's
        (
            T.gradients(2, "w2"),
            "w1",
            Gradient(run_id="r", plan_id=0, stage=2, batch_id=0, g=X, loss=1.0),
            "sender 'w1'",
        ),
        (
            T.gradients(1, "w1"),
            "w1",
            Gradient(run_id="r", plan_id=0, stage=2, batch_id=0, g=X, loss=1.0),
            "gradient of stage 2 on the topic of stage 1",
        ),
        (
            T.syncs(1, "w1"),
            "w1",
            GradSync(
                run_id="r",
                plan_id=0,
                stage=1,
                batch_id=0,
                share_version=0,
                device_id="w3",
                rows=[0, 1],
                total=2,
                grads={},
            ),
            "grad_sync.device_id 'w3'",
        ),
    ],
    ids=[
        "announce-as-another",
        "announce-as-a-ghost",
        "announce-on-anothers-topic",
        "collect-for-another",
        "ready-for-another",
        "error-for-another",
        "fetch-for-another",
        "gradient-as-another",
        "gradient-of-another-stage",
        "sync-for-another",
    ],
)
def test_a_payload_that_speaks_for_another_device_is_refused(
    topic: str, sender: str, message: Message, why: str
) -> None:
    problem = identity_problem(T.parse(topic), sender, message)
    assert problem is not None and why in problem, problem


def test_a_device_speaking_for_itself_passes() -> None:
    cases: list[tuple[str, str, Message]] = [
        (T.device(Family.ANNOUNCE, "w1"), "w1", Announce(device_id="w1")),
        (T.device(Family.REPLY, "w1"), "w1", collect("w1")),
        (T.activations(1, "w1"), "w1", Activation("r", 0, 1, 0, 0, "train", X, Y)),
        (T.device(Family.PROFILE, "w1"), "central", Heartbeat(device_id="w1", seq=1)),  # the central's topic
        (T.fixed(Family.COMMAND), "anyone", Heartbeat(device_id="w9", seq=1)),  # no device: not checked here
    ]
    for topic, sender, message in cases:
        assert identity_problem(T.parse(topic), sender, message) is None, topic


def test_a_role_drops_what_speaks_for_another_device_and_counts_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="edgeagent.runtime.role")
    broker = MemoryBroker()
    role = Role(MemoryTransport(broker, "central"), T, "central")
    role.listen(T.all())
    intruder = MemoryTransport(broker, "intruder")
    intruder.publish(
        T.device(Family.ANNOUNCE, "intruder"), encode(Announce(device_id="a-ghost"), sender="intruder")
    )
    intruder.publish(T.device(Family.REPLY, "intruder"), encode(collect("w2"), sender="intruder"))
    intruder.publish(T.device(Family.ANNOUNCE, "w2"), encode(Announce(device_id="w2"), sender="intruder"))
    assert role.gate.drops == {SENDER: 3} and role.inbox.empty()
    assert "a device speaks only for itself" in caplog.text
    intruder.publish(
        T.device(Family.ANNOUNCE, "intruder"), encode(Announce(device_id="intruder"), sender="intruder")
    )
    item = role.next_message(0)
    assert item is not None and isinstance(item.message, Announce) and item.message.device_id == "intruder"


# -- stage outputs only from the plan's holders --------------------------------------------------


def test_stage_outputs_are_taken_only_from_the_devices_that_hold_the_stage() -> None:
    senders = StageSenders()
    view = PlanView("r", 3, [["c"], ["w1"], ["w2"]])
    senders.plan = lambda: view
    grad = Gradient(run_id="r", plan_id=3, stage=1, batch_id=0, g=X, loss=1.0)
    assert senders.problem(T.parse(T.gradients(1, "w1")), grad) is None
    problem = senders.problem(T.parse(T.gradients(1, "w2")), grad)
    assert problem == "'w2' does not hold stage 1 in plan 3 (held by ['w1'])"
    assert senders.problem(T.parse(T.gradients(7, "w2")), grad) is not None  # no such stage
    # Another plan's or run's message is the handlers' to drop as stale, whoever sent it.
    assert senders.problem(T.parse(T.gradients(1, "w2")), Gradient("r", 2, 1, 0, X, 1.0)) is None
    assert senders.problem(T.parse(T.gradients(1, "w2")), Gradient("q", 3, 1, 0, X, 1.0)) is None
    senders.plan = None  # no run: nothing to check against
    assert senders.problem(T.parse(T.gradients(1, "w2")), grad) is None


def test_a_member_that_left_a_hybrid_stage_still_delivers_its_pieces_of_the_plan() -> None:
    """A failover inside a plan (a reshare) removes a member; what it computed before may still count."""
    senders = StageSenders()
    view = PlanView("r", 0, [["c"], ["w1", "w3"], ["w2"]])
    senders.plan = lambda: view
    sync = GradSync("r", 0, 1, 5, 0, "w3", [0, 1], 2, {})
    senders.see(view)  # the run sees the groups before it changes them
    view = PlanView("r", 0, [["c"], ["w1"], ["w2"]])
    assert senders.problem(T.parse(T.syncs(1, "w3")), sync) is None
    assert senders.problem(T.parse(T.syncs(1, "w2")), dataclass_replace(sync, device_id="w2")) is not None
    view = PlanView("r", 1, [["c"], ["w1"], ["w2"]])  # the next plan forgets it
    assert senders.problem(T.parse(T.syncs(1, "w3")), dataclass_replace(sync, plan_id=1)) is not None


def dataclass_replace(msg: GradSync, **changes: object) -> GradSync:
    import dataclasses

    return dataclasses.replace(msg, **changes)  # type: ignore[arg-type]


# -- the allow-list of user models ---------------------------------------------------------------


def test_the_allow_list_takes_dotted_paths_in_either_spelling() -> None:
    assert model_path("pkg.mod:build") == model_path("pkg.mod.build") == "pkg.mod:build"
    assert model_path("mlp") is None
    config = WorkerConfig(device_id="pi-1", allowed_models=["pkg.mod.build"])
    assert config.model_refusal("pkg.mod:build") is None
    assert config.model_refusal("mlp") is None  # built-in models need no entry
    refusal = config.model_refusal("os:system")
    assert refusal is not None and "allowed_models: [os:system]" in refusal and "--allow-model" in refusal
    with pytest.raises(ConfigError, match=r"allowed_models.*'mlp' is not a dotted path"):
        build(WorkerConfig, {"allowed_models": ["mlp"]}, source="worker.yaml")


def assign(model: str) -> Assign:
    return make_assign(
        run_id="r", points=[0, 1, 4], model={"name": model, "in_shape": [4], "num_classes": 2, "options": {}}
    )


@pytest.mark.parametrize(("allowed", "builds"), [([], False), ([TINY], True)])
def test_a_worker_builds_a_user_model_only_from_its_allow_list(allowed: list[str], builds: bool) -> None:
    broker = MemoryBroker()
    worker = Worker(
        WorkerConfig(cluster="id", device_id="w1", allowed_models=allowed),
        transport=MemoryTransport(broker, "w1"),
        modes=mode,
    )
    worker.listen(T.device(Family.CONTROL, "w1"))
    replies: list[Message] = []
    MemoryTransport(broker, "spy").subscribe(
        T.device(Family.REPLY, "w1"), lambda _t, p: replies.append(decode(p)[1])
    )
    MemoryTransport(broker, "central").publish(
        T.device(Family.CONTROL, "w1"), encode(assign(TINY), sender="central")
    )
    worker._step()
    assert (worker.session is not None) is builds
    errors = [m for m in replies if isinstance(m, ErrorReport)]
    if builds:
        assert errors == [] and any(isinstance(m, Ready) and m.phase == "built" for m in replies)
    else:
        [error] = errors
        assert error.code == "assign" and "allowed_models" in error.reason and TINY in error.reason


# -- plain text beyond loopback --------------------------------------------------------------------


def test_a_password_goes_in_clear_only_to_loopback() -> None:
    for safe in (
        "mqtt://w1:pw@127.0.0.1:1883",
        "mqtt://w1:pw@localhost",
        "mqtt://[::1]:1883",
        "mqtts://w1:pw@central.local:8883",
        "mqtt://central.local:1883",
    ):
        BrokerUrl.parse(safe).check_password_safe()
    for unsafe in ("mqtt://w1:pw@central.local:1883", "mqtt://w1:pw@192.168.1.10", "mqtt://w1:pw@0.0.0.0"):
        with pytest.raises(ConfigError, match=r"refusing to send the broker password.*mqtts://.*--ca-file"):
            BrokerUrl.parse(unsafe).check_password_safe()
        BrokerUrl.parse(unsafe).check_password_safe(insecure_plaintext=True)  # asked for: a warning
        BrokerUrl.parse(unsafe).check_password_safe(encrypted=True)  # TLS options on an mqtt:// URL
    assert is_loopback("127.0.0.2") and not is_loopback("central.local")


def test_a_broker_beyond_loopback_refuses_plain_tcp_unless_asked(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(
        ConfigError, match=r"beyond loopback, in plain TCP.*--cert-file.*--insecure-plaintext"
    ):
        broker_config("0.0.0.0", 1883, credentials="creds")
    with caplog.at_level(logging.WARNING):
        assert broker_config("0.0.0.0", 1883, credentials="creds", insecure_plaintext=True)["listeners"]
    assert "INSECURE" in caplog.text
    assert broker_config("127.0.0.1", 1883)["listeners"]  # loopback: plain TCP is fine


def test_the_shipped_units_and_configs_use_tls() -> None:
    """What docs/deployment.md installs: TLS everywhere on the LAN, the files under /etc/edgeagent/tls handed
    to the dynamic users with LoadCredential=."""
    repo = Path(__file__).resolve().parents[2]
    for name, model in (("worker.yaml", WorkerConfig), ("central.yaml", CentralConfig)):
        config = build(model, load_yaml(repo / "configs" / name), source=name)
        assert BrokerUrl.parse(config.broker).tls and not config.insecure_plaintext, name
        files = (config.ca_file, config.cert_file, config.key_file)
        assert all(f and f.startswith("/etc/edgeagent/tls/") for f in files), (name, files)
    units = {unit.stem: unit.read_text() for unit in (repo / "systemd").glob("*.service")}
    assert "--insecure-plaintext" not in "".join(units.values())
    broker = units["edgeagent-broker"]
    assert "--port 8883" in broker and "--cert-file ${CREDENTIALS_DIRECTORY}/broker.pem" in broker
    assert (
        "--require-client-cert" in broker
        and "LoadCredential=broker.key:/etc/edgeagent/tls/broker.key" in broker
    )
    for role in ("central", "worker"):
        unit = units[f"edgeagent-{role}"]
        assert "LoadCredential=ca.pem:/etc/edgeagent/tls/ca.pem" in unit, role
        assert (
            "--ca-file ${CREDENTIALS_DIRECTORY}/ca.pem" in unit
            and "--key-file ${CREDENTIALS_DIRECTORY}/" in unit
        )
