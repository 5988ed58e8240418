"""Real workers and a real ``edgeagent demo`` under cgroup CPU quotas (root and a cgroup cpu controller
only): the quota group is joined, kept across a restart and removed on stop or SIGTERM."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from edgeagent.cli.demo import LocalWorkers, cgroup_root
from edgeagent.ops import cgroups
from edgeagent.ops.cgroups import cgroup_problem
from tests.conftest import first_pid_in, terminate_and_check_unwound


def _joins(group: Path, pid: int, timeout: float = 10.0) -> bool:
    """Whether ``pid`` shows up in ``group`` within ``timeout`` s (the shell joins, then execs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if str(pid) in (group / "cgroup.procs").read_text().split():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(cgroup_problem() is not None, reason=f"needs {cgroup_problem()}")
def test_worker_runs_in_its_quota_group() -> None:
    cluster = f"test-{uuid.uuid4().hex[:6]}"
    # No broker listens there: the worker keeps trying to connect, which is all this test needs.
    local = LocalWorkers(2, "mqtt://127.0.0.1:9", cluster, [1.0, 1.0], cpu=[50.0, 0.0], threads=[2, 1])
    root = cgroup_root(cluster)
    try:
        local.start_all()
        group = local.cgroup("worker-1")
        assert group == root / "worker-1" and local.cgroup("worker-2") is None
        assert (group / "cpu.cfs_quota_us").read_text().strip() == "5000"  # 50 % of the 10 ms period
        assert (group / "cpu.cfs_period_us").read_text().strip() == "10000"
        assert _joins(group, local.procs["worker-1"].pid)
        assert local.procs["worker-2"].pid not in cgroups.cgroup_pids(root)
        # A restart joins the same group.
        assert _joins(group, local.restart("worker-1").pid)
    finally:
        local.stop(grace=0)
    assert not root.exists()  # stop() removed the groups


@pytest.mark.skipif(cgroup_problem() is not None, reason=f"needs {cgroup_problem()}")
def test_terminated_demo_removes_its_groups(tmp_path: Path) -> None:
    """SIGTERM to ``edgeagent demo --worker-cpu`` unwinds it: the worker stops, its group is removed."""
    cluster = f"test-{uuid.uuid4().hex[:6]}"
    group = cgroup_root(cluster) / "worker-1"
    cmd = [sys.executable, "-m", "edgeagent", "demo", "--workers", "1", "--worker-cpu", "50"]
    cmd += ["--cluster", cluster, "--no-progress", "--epochs", "50", "--log-level", "WARNING"]
    log = tmp_path / "demo.log"
    with log.open("wb") as err:
        demo = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    try:
        terminate_and_check_unwound(demo, log, first_pid_in(group, demo))
        assert not cgroup_root(cluster).exists()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        cgroups.remove_cgroups(cgroup_root(cluster))
