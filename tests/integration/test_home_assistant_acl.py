"""`--home-assistant` on brokers that enforce the logins' topic rights, as deployed.

A real run (central + 2 workers, each with its own login) publishes the discovery configs from the
central login; Home Assistant logs in as an observer and must receive one config per device and
sensor. The embedded broker and Mosquitto get the same credentials directory.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeagent.broker import EmbeddedBroker
from edgeagent.broker.credentials import CredentialStore
from edgeagent.cli.demo import run_demo, throwaway_logins
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.ops.homeassistant import sensors_of
from edgeagent.transport.mqtt import MqttTransport
from tests.conftest import MosquittoProcess

pytestmark = pytest.mark.slow

DEVICES = ["central", "worker-1", "worker-2"]


@pytest.fixture
def credentials(tmp_path: Path, cluster: str) -> tuple[Path, dict[str, str], str]:
    """The run's logins and an observer login for Home Assistant (its password)."""
    directory = tmp_path / "credentials"
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    logins = throwaway_logins(str(directory), cluster, DEVICES, str(secrets))
    hass = CredentialStore(directory).add("hass", role="observer", cluster=cluster)
    return directory, logins, hass


@pytest.fixture(params=["amqtt", "mosquitto"])
def secured_url(
    request: pytest.FixtureRequest, tmp_path: Path, credentials: tuple[Path, dict[str, str], str]
) -> Iterator[str]:
    directory = credentials[0]
    if request.param == "amqtt":
        with EmbeddedBroker("127.0.0.1", credentials=str(directory)) as broker:
            yield broker.url
        return
    if shutil.which("mosquitto") is None:
        pytest.skip("the mosquitto binary is not installed")
    extra = (  # root: pytest's 0700 temporary directories (see tests/protocol/test_security.py)
        f"user root\npassword_file {directory / 'mosquitto.passwd'}\nacl_file {directory / 'mosquitto.acl'}\n"
    )
    proc = MosquittoProcess(tmp_path, extra=extra, anonymous=False).start()
    try:
        yield proc.url
    finally:
        proc.stop()


def test_discovery_reaches_home_assistant_through_the_acl(
    secured_url: str, credentials: tuple[Path, dict[str, str], str], cluster: str
) -> None:
    _, logins, hass_password = credentials
    found: dict[str, dict[str, object]] = {}
    lock = threading.Lock()

    def on_message(topic: str, payload: bytes) -> None:
        with lock:
            found[topic] = json.loads(payload)

    hass_url = secured_url.replace("mqtt://", f"mqtt://hass:{hass_password}@")
    hass = MqttTransport(hass_url, f"home-assistant-{cluster}")
    hass.subscribe("homeassistant/+/+/+/config", on_message)  # what Home Assistant subscribes to
    try:
        assert hass.wait_connected(10)
        train = TrainConfig(epochs=1, max_batches=20)
        config = CentralConfig(cluster=cluster, train=train, progress=False, home_assistant=True)
        run_demo(config, workers=2, slowdowns=[], broker=secured_url, show_progress=False, logins=logins)
    finally:
        hass.close()
    node = f"edgeagent_{cluster}"
    expected = {
        f"homeassistant/{s.component}/{node}/{node}_{device.replace('-', '_')}_{s.key}/config"
        for device in DEVICES
        for s in sensors_of(central=device == "central")
    }
    assert set(found) == expected
    for discovery in found.values():
        assert str(discovery["state_topic"]).startswith(f"edgeagent/v1/{cluster}/device/")
