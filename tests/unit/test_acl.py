"""The topic-rights policy and the credentials directory, without a broker."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgeagent.broker.credentials import CredentialStore, mosquitto_hash, verify_mosquitto_hash
from edgeagent.cli import main
from edgeagent.errors import ConfigError
from edgeagent.ops.homeassistant import discovery_configs
from edgeagent.protocol.acl import (
    Grant,
    PlanTracker,
    client_id_ok,
    may_publish,
    may_receive,
    may_subscribe,
    mosquitto_acl,
)
from edgeagent.protocol.topics import Family, Topics

T = Topics("site")
DEVICE = Grant("device", "site")


def test_device_publishes_its_own_topics_only() -> None:
    plans = PlanTracker()
    assert may_publish("w1", DEVICE, T.device(Family.STATUS, "w1"), plans)
    assert may_publish("w1", DEVICE, T.device(Family.ANNOUNCE, "w1"), plans)
    assert not may_publish("w1", DEVICE, T.device(Family.ANNOUNCE, "w2"), plans)  # announcing as another
    assert not may_publish("w1", DEVICE, T.device(Family.STATUS, "w2"), plans)
    assert not may_publish("w1", DEVICE, T.device(Family.CONTROL, "w1"), plans)
    assert not may_publish("w1", DEVICE, T.device(Family.PROFILE, "w1"), plans)
    assert not may_publish("w1", DEVICE, T.fixed(Family.COMMAND), plans)
    assert not may_publish("w1", DEVICE, Topics("other").device(Family.STATUS, "w1"), plans)
    assert not may_publish("w1", DEVICE, "edgeagent/v1/site/not/a/topic", plans)
    assert not may_publish("w1", Grant("observer", "site"), T.device(Family.STATUS, "w1"), plans)
    assert may_publish("c", Grant("central", "site"), T.fixed(Family.COMMAND), plans)
    assert may_publish("c", Grant("central", "*"), Topics("any").fixed(Family.COMMAND), plans)
    assert not may_publish("c", Grant("central", "site"), Topics("other").fixed(Family.COMMAND), plans)


def test_stage_outputs_follow_the_newest_two_plans() -> None:
    plans = PlanTracker()
    assert not may_publish("w1", DEVICE, T.gradients(1, "w1"), plans)  # no plan: nothing
    assert plans.update("site", "r", 0, ["c", "w1", "w2"])
    assert may_publish("w1", DEVICE, T.gradients(1, "w1"), plans)
    assert may_publish("w1", DEVICE, T.results(1, "w1"), plans)
    assert not may_publish("w1", DEVICE, T.gradients(2, "w1"), plans)
    assert not plans.update("site", "r", 0, ["c", "w1", "w2"])  # the same plan again
    assert not plans.update("site", "r", -1, ["c", "w2", "w1"])  # an older plan is ignored
    assert plans.update("site", "r", 1, ["c", "w2", "w1"])
    assert may_publish("w1", DEVICE, T.gradients(1, "w1"), plans) and may_publish(
        "w1", DEVICE, T.gradients(2, "w1"), plans
    )
    assert plans.update("site", "r", 2, ["c", "w2", "w1"])
    assert not may_publish("w1", DEVICE, T.gradients(1, "w1"), plans)
    assert plans.update("site", "r2", 0, ["c", "w1"])  # a new run forgets the old one's plans
    assert not may_publish("w1", DEVICE, T.gradients(2, "w1"), plans)
    assert PlanTracker.from_json(plans.to_json()) == plans
    with pytest.raises(ValueError):
        PlanTracker.from_json("[1, 2]")


def test_every_member_of_a_stage_group_publishes_its_outputs() -> None:
    plans = PlanTracker()
    # Hybrid stages: stage 1 is held by w1 (primary) and w3 (helper); stage 2 by w2 alone.
    assert plans.update("site", "r", 0, ["c", "w1", "w2"], groups=[["c"], ["w1", "w3"], ["w2"]])

    def outputs(device: str) -> tuple[str, ...]:
        return (T.activations(1, device), T.gradients(1, device), T.results(1, device), T.syncs(1, device))

    for device in ("w1", "w3"):
        assert all(may_publish(device, DEVICE, topic, plans) for topic in outputs(device)), device
        assert not may_publish(device, DEVICE, T.syncs(2, device), plans)
        assert not may_publish(device, DEVICE, T.activations(2, device), plans)
        # Its own outputs only: never under another member's id.
        other = "w3" if device == "w1" else "w1"
        assert not any(may_publish(device, DEVICE, topic, plans) for topic in outputs(other))
    assert not any(may_publish("w2", DEVICE, topic, plans) for topic in outputs("w2"))
    assert may_publish("w2", DEVICE, T.syncs(2, "w2"), plans)
    assert not may_publish("w9", DEVICE, T.syncs(1, "w9"), plans)
    # The same assignment again changes nothing; empty groups are one device per stage.
    assert not plans.update("site", "r", 0, ["c", "w1", "w2"], groups=[["c"], ["w1", "w3"], ["w2"]])
    assert plans.update("site", "r2", 0, ["c", "w1", "w2"], groups=[])
    assert not may_publish("w3", DEVICE, T.syncs(1, "w3"), plans)
    assert PlanTracker.from_json(plans.to_json()) == plans


def test_a_reshare_changes_the_groups_inside_a_plan() -> None:
    plans = PlanTracker()
    plans.update("site", "r", 0, ["c", "w1"])
    assert plans.update("site", "r", 1, ["c", "w1", "w2"], groups=[["c"], ["w1", "w3"], ["w2", "w4"]])
    assert may_publish("w4", DEVICE, T.gradients(2, "w4"), plans) and may_publish(
        "w3", DEVICE, T.syncs(1, "w3"), plans
    )
    # w4 died: the central node gives stage 2 to w2 alone (same plan, next share version) ...
    assert plans.update(
        "site", "r", 1, ["c", "w1", "w2"], groups=[["c"], ["w1", "w3"], ["w2"]], share_version=1
    )
    assert not may_publish("w4", DEVICE, T.gradients(2, "w4"), plans)
    assert not may_publish("w4", DEVICE, T.syncs(2, "w4"), plans)
    assert may_publish("w2", DEVICE, T.syncs(2, "w2"), plans) and may_publish(
        "w3", DEVICE, T.syncs(1, "w3"), plans
    )
    # ... the previous plan (still draining) keeps its rights ...
    assert may_publish("w1", DEVICE, T.gradients(1, "w1"), plans)
    assert plans.plans["site"].previous == [["c"], ["w1"]]
    # ... and an older share version of the same plan (overtaken) does not bring w4 back.
    assert not plans.update(
        "site", "r", 1, ["c", "w1", "w2"], groups=[["c"], ["w1", "w3"], ["w2", "w4"]], share_version=0
    )
    assert not may_publish("w4", DEVICE, T.gradients(2, "w4"), plans)
    # The next plan makes the reshared groups the previous ones.
    assert plans.update("site", "r", 2, ["c", "w2", "w1"])
    assert may_publish("w3", DEVICE, T.results(1, "w3"), plans)
    assert not may_publish("w3", DEVICE, T.results(2, "w3"), plans)
    assert PlanTracker.from_json(plans.to_json()) == plans


def test_plan_state_of_an_older_broker_still_loads() -> None:
    """plans.json before hybrid stages: ``[run_id, plan_id, worker_list, previous_worker_list]``."""
    old = '{"site": ["r", 3, ["c", "w1", "w2"], ["c", "w2", "w1"]], "lab": ["q", 0, ["c"], []]}'
    plans = PlanTracker.from_json(old)
    assert plans.plans["site"] == ("r", 3, [["c"], ["w1"], ["w2"]], [["c"], ["w2"], ["w1"]], 0)
    assert may_publish("w1", DEVICE, T.gradients(1, "w1"), plans)
    assert may_publish("w1", DEVICE, T.gradients(2, "w1"), plans)
    assert not may_publish("w3", DEVICE, T.gradients(1, "w3"), plans)
    assert not plans.update("site", "r", 3, ["c", "w1", "w2"])  # the same plan, as the old broker knew it
    assert PlanTracker.from_json(plans.to_json()) == plans
    for bad in ('{"site": ["r", 3]}', '{"site": "r"}', '{"site": ["r", "x", [], []]}'):
        with pytest.raises(ValueError):
            PlanTracker.from_json(bad)


def test_device_reads_and_subscribes_to_what_it_needs() -> None:
    assert may_receive("w1", DEVICE, T.device(Family.CONTROL, "w1"))
    assert not may_receive("w1", DEVICE, T.device(Family.CONTROL, "w2"))
    assert not may_receive("w1", DEVICE, T.device(Family.HEARTBEAT, "w2"))
    assert may_receive("w1", DEVICE, T.device(Family.REPLICA, "w2"))
    assert may_receive("w1", DEVICE, T.activations(7, "w2"))
    assert may_receive("w1", DEVICE, T.syncs(7, "w2"))  # a group's gradient exchange
    assert not may_receive("w1", DEVICE, T.results(7, "w2"))
    assert may_subscribe("w1", DEVICE, T.stage_filter(Family.SYNC, 1))
    assert may_subscribe("w1", DEVICE, T.stage_filter(Family.ACTIVATIONS, 0))
    assert not may_subscribe("w1", DEVICE, T.stage_filter(Family.RESULTS, 2))
    assert may_receive("w1", DEVICE, T.fixed(Family.COMMIT))
    assert not may_receive("w1", DEVICE, T.device(Family.ANNOUNCE, "w2"))
    assert may_subscribe("w1", DEVICE, T.devices(Family.REQUEST))
    # A filter that also matches others' topics is refused: amqtt delivers the retained messages a new
    # subscription matches (profiles, statuses) without asking the per-message check.
    assert not may_subscribe("w1", DEVICE, T.devices(Family.CONTROL))
    assert not may_subscribe("w1", DEVICE, T.devices(Family.PROFILE))
    assert may_subscribe("w1", DEVICE, T.devices(Family.STATUS))  # peers' status: readable
    assert not may_subscribe("w1", DEVICE, T.all())
    assert not may_subscribe("w1", DEVICE, T.device(Family.CONTROL, "w2"))
    assert not may_subscribe("w1", DEVICE, "edgeagent/v1/+/#")
    assert not may_subscribe("w1", DEVICE, "#")
    assert may_subscribe("o", Grant("observer", "site"), T.all())


def test_home_assistant_discovery_is_the_central_logins_and_home_assistant_reads_it() -> None:
    plans = PlanTracker()
    central, observer = Grant("central", "site"), Grant("observer", "site")
    [config] = [t for t in discovery_configs(T, "w1") if t.endswith("_state/config")]
    assert config.startswith("homeassistant/sensor/edgeagent_site/")
    assert may_publish("c", central, config, plans)
    assert may_publish("c", Grant("central", "*"), config, plans)
    # Only its own cluster's node, and nothing else of Home Assistant's (other things in the house).
    assert not may_publish("c", central, config.replace("edgeagent_site", "edgeagent_other"), plans)
    assert not may_publish("c", central, "homeassistant/light/kitchen/config", plans)
    assert not may_publish("c", central, "homeassistant/status", plans)
    assert not may_publish("c", central, "homeassistant/sensor/edgeagent_site/+/config", plans)
    # Devices: nothing there.
    assert not may_publish("w1", DEVICE, config, plans)
    assert not may_receive("w1", DEVICE, config)
    assert not may_subscribe("w1", DEVICE, "homeassistant/#")
    # Home Assistant's login reads the configs and sends its birth message and will, nothing else.
    assert may_subscribe("ha", observer, "homeassistant/+/+/+/config")
    assert may_subscribe("ha", observer, "homeassistant/#")
    assert may_receive("ha", observer, config)
    assert may_publish("ha", observer, "homeassistant/status", plans)
    assert not may_publish("ha", observer, config, plans)
    assert not may_subscribe("ha", observer, "#")


def test_the_discovery_prefix_is_per_login() -> None:
    plans = PlanTracker()
    central = Grant("central", "site", home_assistant_prefix="ha/discovery")
    [config] = [t for t in discovery_configs(T, "w1", prefix="ha/discovery") if t.endswith("_state/config")]
    assert may_publish("c", central, config, plans)
    assert not may_publish("c", central, config.replace("ha/discovery", "homeassistant"), plans)
    assert may_receive("ha", Grant("observer", "site", home_assistant_prefix="ha/discovery"), config)
    assert not may_receive("ha", Grant("observer", "site"), config)


def test_client_ids_belong_to_their_devices() -> None:
    users = {"w1": DEVICE, "w2": DEVICE, "c": Grant("central", "site")}
    assert client_id_ok("w1", DEVICE, "ea-site-w1", users)
    assert not client_id_ok("w1", DEVICE, "ea-site-w2", users)
    assert not client_id_ok("c", users["c"], "ea-site-w2", users)
    assert client_id_ok("c", users["c"], "ea-profile-123", users)


def test_mosquitto_acl_lists_every_user() -> None:
    text = mosquitto_acl({"w1": DEVICE, "c": Grant("central", "site"), "o": Grant("observer", "*")})
    assert "user c\ntopic readwrite edgeagent/v1/site/#" in text
    assert "user o\ntopic read edgeagent/v1/+/#" in text
    assert "topic write edgeagent/v1/site/device/w1/heartbeat" in text
    assert "topic write edgeagent/v1/site/device/w1/announce" in text
    # Stage outputs only under its own id (the receivers check the plan); every device's to read.
    assert "topic write edgeagent/v1/site/stage/+/sync/w1" in text
    assert "topic write edgeagent/v1/site/stage/+/result/w1" in text
    assert "topic read edgeagent/v1/site/stage/+/sync/+" in text
    assert "topic read edgeagent/v1/site/stage/+/input/+" in text  # a helper of stage 0's input rows
    assert "topic read edgeagent/v1/site/stage/+/result/+" not in text
    # Everything a device may write names it: no shared topic (the announcement was one).
    device_block = text.split("user w1\n")[1].split("\n\n")[0]
    written = [line.split()[-1] for line in device_block.splitlines() if line.split()[1] != "read"]
    assert written and all("/w1/" in topic or topic.endswith("/w1") for topic in written), written
    assert "device/w2" not in text
    # Home Assistant discovery: the central login writes its node's configs, observers read them.
    users = {block.split("\n")[0]: block for block in text.split("\n\n") if block.startswith("user ")}
    assert "topic write homeassistant/+/edgeagent_site/+/config" in users["user c"]
    assert "topic read homeassistant/#\ntopic write homeassistant/status" in users["user o"]
    assert "homeassistant" not in users["user w1"]
    star = mosquitto_acl({"op": Grant("central", "*", home_assistant_prefix="ha")})
    assert "topic write ha/+/+/+/config" in star


def test_mosquitto_hash_round_trip() -> None:
    encoded = mosquitto_hash("correct horse battery")
    assert encoded.startswith("$7$101$")
    assert verify_mosquitto_hash("correct horse battery", encoded)
    assert not verify_mosquitto_hash("wrong", encoded)
    assert not verify_mosquitto_hash("x", "$6$garbage")


def test_credential_store(tmp_path: Path) -> None:
    store = CredentialStore(tmp_path / "c")
    password = store.add("w1", cluster="site")
    assert store.verify("w1", password) and not store.verify("w1", "nope") and not store.verify("w9", "x")
    assert stat.S_IMODE((tmp_path / "c" / "passwd").stat().st_mode) == 0o640
    assert password not in "".join(p.read_text() for p in (tmp_path / "c").iterdir())
    with pytest.raises(ConfigError, match="at least 12"):
        store.add("w2", password="short")
    with pytest.raises(ConfigError, match="role"):
        store.add("w2", role="admin")
    with pytest.raises(ConfigError, match="invalid user name"):
        store.add("w/2")
    with pytest.raises(ConfigError, match=r"no user 'w2'.*users: w1"):
        store.remove("w2")
    with pytest.raises(ConfigError, match="discovery prefix"):
        store.add("hub", role="central", home_assistant_prefix="edgeagent/v1/site")
    store.add("hub", role="central", cluster="site", home_assistant_prefix="ha")
    assert store.grants()["hub"] == Grant("central", "site", home_assistant_prefix="ha")
    assert store.grants()["w1"].home_assistant_prefix == "homeassistant"
    users_yaml = (tmp_path / "c" / "users.yaml").read_text()
    assert "home_assistant_prefix: ha" in users_yaml and users_yaml.count("home_assistant_prefix") == 1
    assert "topic write ha/+/edgeagent_site/+/config" in (tmp_path / "c" / "mosquitto.acl").read_text()
    (tmp_path / "c" / "users.yaml").write_text("users:\n  w1: {role: king}\n")
    with pytest.raises(ConfigError, match="needs role"):
        store.users()
    (tmp_path / "c" / "users.yaml").write_text("users:\n  w1: {role: central, home_assistant_prefix: '#'}\n")
    with pytest.raises(ConfigError, match=r"users.yaml: user 'w1'.*discovery prefix"):
        store.users()


def test_credentials_cli(tmp_path: Path) -> None:
    runner = CliRunner()
    directory = str(tmp_path / "c")
    profiles = tmp_path / "devices"
    profiles.mkdir()
    (profiles / "pi-1.yaml").write_text("id: pi-1\n")
    out = tmp_path / "secrets"
    result = runner.invoke(
        main,
        [
            "credentials",
            "add",
            "--credentials-dir",
            directory,
            "--cluster",
            "site",
            "--profiles",
            str(profiles),
            "--password-out",
            str(out),
            "hub",
        ],
    )
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE((out / "pi-1.password").stat().st_mode) == 0o600
    store = CredentialStore(directory)
    assert store.verify("pi-1", (out / "pi-1.password").read_text().strip())
    listing = runner.invoke(main, ["credentials", "list", "--credentials-dir", directory])
    assert "hub" in listing.output and "pi-1" in listing.output and "cluster site" in listing.output
    ha = [
        "credentials",
        "add",
        "--credentials-dir",
        directory,
        "--role",
        "observer",
        "--home-assistant-prefix",
        "ha",
        "hass",
    ]
    assert runner.invoke(main, ha).exit_code == 0
    assert store.grants()["hass"] == Grant("observer", "default", home_assistant_prefix="ha")
    assert (
        "home assistant ha"
        in runner.invoke(main, ["credentials", "list", "--credentials-dir", directory]).output
    )
    assert (
        runner.invoke(
            main, ["credentials", "remove", "--credentials-dir", directory, "hub", "hass"]
        ).exit_code
        == 0
    )
    assert set(store.users()) == {"pi-1"}
    bad = runner.invoke(main, ["credentials", "remove", "--dir", directory, "nobody"])
    assert bad.exit_code == 2 and "no user 'nobody'" in bad.output


def test_a_device_publishes_only_links_from_itself_and_reads_only_links_into_itself() -> None:
    """The allreduce mode's per-sender/receiver links (``link/<from>/<to>``)."""
    from edgeagent.protocol.identity import identity_problem
    from edgeagent.protocol.messages import Heartbeat

    plans = PlanTracker()
    assert may_publish("w1", DEVICE, T.link("w1", "w2"), plans)
    assert may_publish("w1", DEVICE, T.link("w1", "central"), plans)
    assert not may_publish("w1", DEVICE, T.link("w2", "w1"), plans)
    assert not may_publish("w1", DEVICE, T.link("w2", "w3"), plans)
    assert not may_publish("w1", DEVICE, Topics("other").link("w1", "w2"), plans)
    assert not may_publish("o", Grant("observer", "site"), T.link("o", "w2"), plans)
    assert may_publish("c", Grant("central", "site"), T.link("w2", "w3"), plans)
    assert may_receive("w1", DEVICE, T.link("w2", "w1"))
    assert not may_receive("w1", DEVICE, T.link("w2", "w3"))
    assert not may_receive("w1", DEVICE, T.link("w1", "w2"))
    assert may_subscribe("w1", DEVICE, T.links_to("w1"))
    assert not may_subscribe("w1", DEVICE, T.links_to("w2"))
    assert not may_subscribe("w1", DEVICE, "edgeagent/v1/site/link/#")
    # Without a broker ACL the receiver still checks that the envelope names the link's sender.
    info, any_message = T.parse(T.link("w1", "w2")), Heartbeat(device_id="w1", seq=1)
    assert identity_problem(info, "w1", any_message) is None
    assert identity_problem(info, "w3", any_message) is not None
    text = mosquitto_acl({"w1": DEVICE})
    assert "topic write edgeagent/v1/site/link/w1/+" in text
    assert "topic read edgeagent/v1/site/link/+/w1" in text
