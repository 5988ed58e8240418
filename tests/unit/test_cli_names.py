"""One spelling across the tools (`--<what>-file`, `--<what>-dir`), the earlier ones kept as deprecated
aliases that still work and warn once."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from edgeagent.cli import flags
from edgeagent.cli.main import main


@pytest.fixture(autouse=True)
def _warn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flags, "_warned", set())


def test_credentials_dir_and_its_old_spelling(tmp_path: Path) -> None:
    runner = CliRunner()
    creds = str(tmp_path / "creds")
    added = runner.invoke(main, ["credentials", "add", "--credentials-dir", creds, "pi-1"])
    assert added.exit_code == 0, added.output
    assert "deprecated" not in added.output
    old = runner.invoke(main, ["credentials", "list", "--dir", creds])
    assert old.exit_code == 0 and "pi-1" in old.output  # the alias reached the same directory
    assert "--dir is deprecated; use --credentials-dir" in old.output
    again = runner.invoke(main, ["credentials", "list", "--dir", creds])
    assert "deprecated" not in again.output  # once per process


def test_broker_tls_flags_old_and_new(tmp_path: Path) -> None:
    cert = tmp_path / "broker.pem"
    cert.write_text("")
    runner = CliRunner()
    new = runner.invoke(main, ["broker", "--cert-file", str(cert)])
    assert new.exit_code != 0 and "--cert-file and --key-file go together" in new.output
    old = runner.invoke(main, ["broker", "--tls-cert", str(cert)])  # filled --cert-file: the same check
    assert old.exit_code != 0 and "--cert-file and --key-file go together" in old.output
    assert "--tls-cert is deprecated; use --cert-file" in old.output
    help_text = " ".join(runner.invoke(main, ["broker", "--help"]).output.split())
    assert "--credentials-dir" in help_text and "[default: 127.0.0.1]" in help_text
    assert "--tls-cert" not in help_text  # hidden: only the new names are shown


def test_certs_dir_and_the_old_positional_directory(tmp_path: Path) -> None:
    runner = CliRunner()
    new = runner.invoke(main, ["certs", "--certs-dir", str(tmp_path / "a"), "--device", "pi-1"])
    assert new.exit_code == 0, new.output
    assert (tmp_path / "a" / "pi-1.pem").is_file()
    old = runner.invoke(main, ["certs", str(tmp_path / "b")])
    assert old.exit_code == 0, old.output
    assert (tmp_path / "b" / "ca.pem").is_file() and "certs DIR is deprecated" in old.output
    missing = runner.invoke(main, ["certs"])
    assert missing.exit_code == 2 and "--certs-dir DIR" in missing.output


def test_tool_options_are_grouped_with_their_defaults() -> None:
    runner = CliRunner()
    monitor = " ".join(runner.invoke(main, ["monitor", "--help"]).output.split())  # wrapped at any width
    for heading in ("Broker:", "Broker login and TLS:", "Display:"):
        assert heading in monitor
    assert "[default: 0.5]" in monitor and "[default: mqtt://127.0.0.1:1883]" in monitor
    push = " ".join(runner.invoke(main, ["profile", "push", "--help"]).output.split())
    assert "Profiles:" in push and "--profiles-dir" in push and "[default: /etc/edgeagent/devices]" in push
