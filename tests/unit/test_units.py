"""The shipped systemd units read as systemd reads them (ops/units.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgeagent.ops import shipped
from edgeagent.ops.units import INSTALLED_PROGRAM, ServiceUnit

UNITS = shipped.UNITS


def test_the_central_units_exec_start_with_this_machines_paths(tmp_path: Path) -> None:
    unit = ServiceUnit.read(UNITS / "edgeagent-central.service")
    argv = unit.command(
        program="/venv/bin/edgeagent",
        state=tmp_path,
        credentials=tmp_path / "creds",
        files={"/etc/edgeagent/central.yaml": tmp_path / "central.yaml"},
    )
    assert argv[:4] == ["/venv/bin/edgeagent", "central", "--config", str(tmp_path / "central.yaml")]
    # The continuation lines are part of the command, their variables expanded.
    assert argv[argv.index("--key-file") + 1] == str(tmp_path / "creds" / "client.key")
    assert not any("$" in a for a in argv)
    assert unit.working_directory(tmp_path) == tmp_path
    assert unit.restart_sec == 5.0 and unit.value("Restart") == "on-failure"
    assert unit.environment() == {"PYTHONUNBUFFERED": "1"}
    names = [name for name, _ in unit.credentials()]
    assert names == ["broker-password", "ca.pem", "client.pem", "client.key"]


def test_the_worker_unit_and_a_command_that_is_not_the_units(tmp_path: Path) -> None:
    unit = ServiceUnit.read(UNITS / "edgeagent-worker.service")
    argv = unit.command(program="edgeagent", state=tmp_path, credentials=tmp_path)
    assert argv[1:3] == ["worker", "--config"]
    with pytest.raises(ValueError, match=r"no argument /etc/edgeagent/central\.yaml"):
        unit.command(
            program="x", state=tmp_path, credentials=tmp_path, files={"/etc/edgeagent/central.yaml": "c"}
        )
    other = tmp_path / "other.service"
    other.write_text("[Service]\nExecStart=/usr/bin/true\nRestartSec=250ms\n")
    with pytest.raises(ValueError, match=re.escape(INSTALLED_PROGRAM)):
        ServiceUnit.read(other).command(program="x", state=tmp_path, credentials=tmp_path)
    assert ServiceUnit.read(other).restart_sec == 0.25
