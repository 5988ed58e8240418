"""``edgeagent demo --worker-cpu / --worker-threads``: parsing and validation (pure) and the cgroup checks.
The real workers under a quota are in tests/integration/test_demo_cgroups_processes.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from edgeagent.cli import demo as demo_module
from edgeagent.cli.demo import (
    CPU_HINT,
    LocalWorkers,
    cgroup_root,
    check_cgroups,
    check_worker_cpu,
    check_worker_threads,
    parse_worker_cpu,
    parse_worker_threads,
    run_demo,
    worker_command,
)
from edgeagent.cli.main import main
from edgeagent.config import CentralConfig
from edgeagent.errors import ConfigError
from edgeagent.ops import cgroups
from edgeagent.ops.cgroups import CPU_ROOT, JOIN, cgroup_problem, joined


def test_worker_cpu_parsing() -> None:
    assert parse_worker_cpu("100,50,25", 3) == [100.0, 50.0, 25.0]
    assert parse_worker_cpu("50", 3) == [50.0, 50.0, 50.0]  # one value: every worker
    assert parse_worker_cpu(" 100, ,25", 3) == [100.0, 0.0, 25.0]  # empty: that worker unlimited
    assert parse_worker_cpu("100,0", 2) == [100.0, 0.0]
    assert parse_worker_cpu("200,60", 2) == [200.0, 60.0]  # more than one core: several threads
    # No limit at all: nothing to set up.
    for text in (None, "", "  ", "0", "0,0,0", ",,"):
        assert parse_worker_cpu(text, 3) == []


def test_worker_cpu_messages() -> None:
    with pytest.raises(ConfigError, match=r"needs 1 value or 3 \(one per worker, central not included\)"):
        parse_worker_cpu("100,50", 3)
    with pytest.raises(ConfigError, match=r"'half' is not a number.*100,50,25"):
        parse_worker_cpu("100,half", 2)
    with pytest.raises(ConfigError, match=r"worker-2 at -5%: give 0 \(no limit\) or at least 1"):
        parse_worker_cpu("100,-5", 2)
    with pytest.raises(ConfigError, match=r"worker-1 at 5%: give 0 .* at least 10 .*1 ms per 10"):
        parse_worker_cpu("5,100", 2)
    with pytest.raises(ConfigError, match=r"worker-1 at nan%"):
        check_worker_cpu([float("nan"), 50.0], 2)
    with pytest.raises(ConfigError, match=r"needs 3 values \(one per worker\), got 2"):
        check_worker_cpu([50.0, 50.0], 3)
    assert check_worker_cpu(None, 2) == [] and check_worker_cpu([0.0, 0.0], 2) == []


def test_worker_threads_parsing_and_messages() -> None:
    assert parse_worker_threads(None, 3) == [1, 1, 1]  # default: one each
    assert parse_worker_threads("", 2) == [1, 1]
    assert parse_worker_threads("1,2", 2) == [1, 2]
    assert parse_worker_threads("2", 3) == [2, 2, 2]
    assert parse_worker_threads("2,", 2) == [2, 1]
    with pytest.raises(ConfigError, match=r"--worker-threads '1,2,3': needs 1 value or 2"):
        parse_worker_threads("1,2,3", 2)
    with pytest.raises(ConfigError, match=r"'1.5' is not a whole number"):
        parse_worker_threads("1.5,1", 2)
    with pytest.raises(ConfigError, match=r"worker-2 with 0 threads; give a whole number 1-256"):
        parse_worker_threads("1,0", 2)
    with pytest.raises(ConfigError, match=r"needs 2 values"):
        check_worker_threads([1], 2)
    assert check_worker_threads(None, 2) == [1, 1]


def test_worker_command_threads() -> None:
    cmd = worker_command("worker-1", "mqtt://127.0.0.1:1883", "c", 1.0, threads=3)
    assert cmd[cmd.index("--threads") + 1] == "3"
    assert worker_command("worker-1", "mqtt://x:1", "c", 1.0)[-3:] == ["--threads", "1", "--once"]


def test_cgroup_paths_and_join() -> None:
    assert cgroup_root("demo-ab12cd") == CPU_ROOT / "edgeagent-demo-demo-ab12cd"
    for bad in ("a/b", "..", ".hidden", "", "x" * 65):
        with pytest.raises(ConfigError, match="cannot name a cgroup"):
            cgroup_root(bad)
    group = Path("/sys/fs/cgroup/cpu/g/worker-1")
    assert joined(["python", "-c", "pass"], group) == ["sh", "-c", JOIN, str(group), "python", "-c", "pass"]


def test_missing_cgroups_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No cpu controller at the root given: the message names it.
    missing = f"missing here: the cgroup v1 cpu controller or a cgroup v2 hierarchy at {tmp_path}"
    with pytest.raises(ConfigError, match=missing):
        check_cgroups(tmp_path)
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    monkeypatch.setattr(cgroups.os, "geteuid", lambda: 1000)
    assert cgroup_problem(tmp_path) == "root"
    with pytest.raises(ConfigError) as err:
        check_cgroups()
    text = str(err.value)
    assert text.startswith(CPU_HINT) and "missing here: root" in text
    with pytest.raises(ConfigError, match="needs root"):  # LocalWorkers checks before it starts anything
        LocalWorkers(1, "mqtt://127.0.0.1:1", "c", [1.0], cpu=[50.0])
    assert LocalWorkers(1, "mqtt://127.0.0.1:1", "c", [1.0], cpu=[0.0]).cgroups is None  # no limit: fine


def test_run_demo_and_cli_refuse_before_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups.os, "geteuid", lambda: 1000)

    def no_broker(*_args: object, **_kw: object) -> None:
        raise AssertionError("the broker must not start when the limits cannot be set")

    monkeypatch.setattr(demo_module, "BrokerProcess", no_broker)
    with pytest.raises(ConfigError, match="--worker-cpu needs root"):
        config = CentralConfig(progress=False)
        run_demo(config, workers=2, slowdowns=[], broker=None, worker_cpu=[100.0, 30.0])
    result = CliRunner().invoke(main, ["demo", "--no-progress", "--worker-cpu", "100,30"])
    assert result.exit_code == 2
    assert f"--worker-cpu needs root and a cgroup cpu controller (v1 or v2) at {CPU_ROOT}" in result.output
    result = CliRunner().invoke(main, ["demo", "--no-progress", "--worker-threads", "1,2,3"])
    assert result.exit_code == 2 and "needs 1 value or 2" in result.output


def test_a_quota_under_one_bandwidth_slice_gets_a_longer_period(tmp_path: Path) -> None:
    """10 ms periods, unless the quota would be under the kernel's 5 ms slice: then the least multiple."""
    assert cgroups.cfs_period_us(1.25, slice_us=5_000) == 10_000
    assert cgroups.cfs_period_us(0.5, slice_us=5_000) == 10_000
    assert cgroups.cfs_period_us(0.35, slice_us=5_000) == 20_000
    assert cgroups.cfs_period_us(0.25, slice_us=5_000) == 20_000
    assert cgroups.cfs_period_us(0.1, slice_us=5_000) == 50_000
    assert cgroups.cfs_period_us(0.1, slice_us=1_000) == 10_000  # the kernel's 1 ms floor still holds
    with pytest.raises(ValueError, match="got 0"):
        cgroups.cfs_period_us(0)
    slice_file = tmp_path / "slice"
    slice_file.write_text("3000\n")
    assert cgroups.bandwidth_slice_us(slice_file) == 3000
    slice_file.write_text("garbage")
    assert cgroups.bandwidth_slice_us(slice_file) == cgroups.DEFAULT_SLICE_US
    assert cgroups.bandwidth_slice_us(tmp_path / "absent") == cgroups.DEFAULT_SLICE_US
