"""``edgeagent install-service`` and ``bundle`` (ops/install.py, broker/bundle.py) and the shipped files the
CLI finds in the package (ops/shipped.py): pure, no broker, no systemd."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from edgeagent.broker.bundle import make_bundle, write_archive
from edgeagent.broker.certs import init_site
from edgeagent.broker.credentials import CredentialStore
from edgeagent.cli.main import main
from edgeagent.config import WorkerConfig, build
from edgeagent.errors import ConfigError
from edgeagent.ops import shipped
from edgeagent.ops.install import UnitPaths, render_unit
from edgeagent.ops.units import ServiceUnit


def test_the_shipped_files_are_found_from_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no checkout here
    assert shipped.config_file("demo.yaml") == shipped.CONFIGS / "demo.yaml"
    assert shipped.config_file("configs/central.yaml") == shipped.CONFIGS / "central.yaml"
    assert shipped.config_file("devices/worker-1.yaml").is_file()
    (tmp_path / "demo.yaml").write_text("demo: {workers: 1}\n")
    assert shipped.config_file("demo.yaml") == Path("demo.yaml")  # a file here wins
    assert shipped.config_file("nothing.yaml") == Path("nothing.yaml")
    assert {p.name for p in shipped.UNITS.glob("*.service")} == {
        f"edgeagent-{role}.service" for role in shipped.ROLES
    }
    with pytest.raises(ValueError, match="roles"):
        shipped.unit_file("monitor")


def test_install_service_writes_this_installs_paths(tmp_path: Path) -> None:
    program = tmp_path / "venv" / "bin" / "edgeagent"
    paths = UnitPaths(program=program, etc=Path("/etc/edgeagent/pi-1"), name="edgeagent-worker-pi-1")
    name, text = render_unit("worker", paths)
    assert name == "edgeagent-worker-pi-1"
    unit_path = tmp_path / f"{name}.service"
    unit_path.write_text(text)
    unit = ServiceUnit.read(unit_path)
    argv = unit.value("ExecStart").split()
    assert argv[:4] == [str(program), "worker", "--config", "/etc/edgeagent/pi-1/worker.yaml"]
    assert dict(unit.credentials())["device.key"] == "/etc/edgeagent/pi-1/tls/device.key"
    assert all(src.startswith("/etc/edgeagent/pi-1/") for _, src in unit.credentials())
    # Its own state directory, named after the unit: two workers on one machine never share one.
    assert unit.value("StateDirectory") == name and unit.value("WorkingDirectory") == f"%S/{name}"
    docs = unit.value("Documentation", section="Unit")
    assert docs.startswith("file://") and Path(docs.removeprefix("file://")).is_file()
    assert "/opt/edgeagent" not in text
    # What the unit runs otherwise is the shipped unit's: type, watchdog, restart, hardening.
    original = ServiceUnit.read(shipped.unit_file("worker")).settings
    for key in ("Type", "WatchdogSec", "Restart", "MemoryMax", "SystemCallFilter", "ProtectSystem"):
        assert unit.value(key) == original[key], key


def test_install_service_config_and_cli(tmp_path: Path) -> None:
    config = tmp_path / "etc" / "central.yaml"
    _, text = render_unit("central", UnitPaths(program=Path("/v/bin/edgeagent"), config=config))
    assert f"central --config {config} " in text.replace("\\\n", " ")
    assert "LoadCredential=ca.pem:/etc/edgeagent/tls/ca.pem" in text  # --etc unchanged: /etc/edgeagent
    with pytest.raises(ConfigError, match="absolute"):
        render_unit("broker", UnitPaths(program=Path("bin/edgeagent")))
    result = CliRunner().invoke(
        main,
        ["install-service", "broker", "--dest", str(tmp_path / "units"), "--program", "/v/bin/edgeagent"],
    )
    assert result.exit_code == 0, result.output
    written = ServiceUnit.read(tmp_path / "units" / "edgeagent-broker.service")
    assert written.value("ExecStart").startswith("/v/bin/edgeagent broker --host 0.0.0.0")
    assert (tmp_path / "units" / "edgeagent-broker.service").stat().st_mode & 0o777 == 0o644
    # A first install of the central node gets the shipped central.yaml where its unit reads it.
    etc = tmp_path / "etc"
    args = ["install-service", "central", "--dest", str(tmp_path / "units"), "--etc", str(etc)]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert (etc / "central.yaml").read_text() == (shipped.CONFIGS / "central.yaml").read_text()
    (etc / "central.yaml").write_text("workers: 3\n")
    assert CliRunner().invoke(main, args).exit_code == 0
    assert (etc / "central.yaml").read_text() == "workers: 3\n"  # never overwritten


def test_bundle_holds_what_a_pi_needs(tmp_path: Path) -> None:
    tls, creds = tmp_path / "tls", tmp_path / "broker"
    init_site(tls, ["central.local"], ["central"])
    made = make_bundle("pi-1", broker="mqtts://central.local:8883", cluster="lab", credentials=creds, tls=tls)
    archive = write_archive(made, tmp_path / "out" / "pi-1.tar.gz")
    assert archive.stat().st_mode & 0o777 == 0o600
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}
        assert set(members) == {
            "worker.yaml",
            "broker-password",
            "tls/ca.pem",
            "tls/device.pem",
            "tls/device.key",
        }
        assert members["tls/device.key"].mode == 0o600 and members["broker-password"].mode == 0o600
        assert all(m.uid == 0 and m.gid == 0 for m in members.values())
        read = {name: tar.extractfile(m).read() for name, m in members.items()}  # type: ignore[union-attr]
    # The login exists with that password, the certificate is the device's and signed by the site CA.
    password = read["broker-password"].decode().strip()
    assert CredentialStore(creds).verify("pi-1", password)
    assert CredentialStore(creds).users()["pi-1"].grant.cluster == "lab"
    assert read["tls/ca.pem"] == (tls / "ca.pem").read_bytes()
    assert read["tls/device.pem"] == (tls / "pi-1.pem").read_bytes()
    assert read["tls/device.key"] == (tls / "pi-1.key").read_bytes()
    config = build(WorkerConfig, yaml.safe_load(read["worker.yaml"]), source="bundle")
    assert (config.device_id, config.broker, config.cluster) == ("pi-1", "mqtts://central.local:8883", "lab")
    assert config.password_file == "broker-password" and config.ca_file == "/etc/edgeagent/tls/ca.pem"
    assert b"# The login" in read["worker.yaml"]  # the shipped comments are kept


def test_bundle_of_a_device_that_has_a_login(tmp_path: Path) -> None:
    tls, creds = tmp_path / "tls", tmp_path / "broker"
    init_site(tls, ["central.local"], ["pi-2"])
    old = CredentialStore(creds).add("pi-2")
    args: dict[str, Any] = {
        "broker": "mqtts://central.local:8883",
        "cluster": "default",
        "credentials": creds,
        "tls": tls,
    }
    with pytest.raises(ConfigError, match="--password-file"):
        make_bundle("pi-2", **args)  # its password is only a hash here
    (tmp_path / "pw").write_text(old + "\n")
    kept = make_bundle("pi-2", password_file=tmp_path / "pw", **args)
    assert kept.members["broker-password"].data.decode().strip() == old
    (tmp_path / "wrong").write_text("x" * 20)
    with pytest.raises(ConfigError, match="not the password"):
        make_bundle("pi-2", password_file=tmp_path / "wrong", **args)
    new = make_bundle("pi-2", rekey=True, etc="/etc/edgeagent/pi-2", **args)
    password = new.members["broker-password"].data.decode().strip()
    assert password != old and CredentialStore(creds).verify("pi-2", password)
    assert b"/etc/edgeagent/pi-2/tls/ca.pem" in new.members["worker.yaml"].data
    with pytest.raises(ConfigError, match="no site CA"):
        make_bundle("pi-3", **{**args, "tls": tmp_path / "none"})


def test_bundle_command(tmp_path: Path) -> None:
    init_site(tmp_path / "tls", ["central.local"], [])
    out = tmp_path / "pi-9.tar.gz"
    result = CliRunner().invoke(
        main,
        [
            "bundle",
            "pi-9",
            "--certs-dir",
            str(tmp_path / "tls"),
            "--credentials-dir",
            str(tmp_path / "broker"),
            "--broker",
            "mqtts://10.0.0.2:8883",
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert out.is_file() and "a new login for pi-9" in result.output
    bad = CliRunner().invoke(
        main, ["bundle", "pi-9", "--tls", str(tmp_path / "tls"), "--credentials", str(tmp_path / "broker")]
    )
    assert bad.exit_code == 2 and "--password-file" in bad.output
