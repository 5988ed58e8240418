"""cgroup v1 and v2 CPU quotas on fake hierarchies (files in tmp_path, as the kernel lays them out).

This machine mounts cgroup v1 (``/sys/fs/cgroup/cpu``); Raspberry Pi OS and current Debian hosts mount
v2 at ``/sys/fs/cgroup``. The real-kernel tests of v1 are in test_demo_cgroups.py (root only).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeagent.ops import cgroups


def _v2_root(tmp_path: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("memory pids\n")  # systemd's usual: no cpu yet
    (root / "cgroup.procs").write_text("1\n")
    return root


def _v1_root(tmp_path: Path) -> Path:
    mount = tmp_path / "cgroup"
    root = mount / "cpu"
    root.mkdir(parents=True)
    (root / "cpu.cfs_quota_us").write_text("-1\n")
    (root / "cpu.cfs_period_us").write_text("100000\n")
    (root / "cgroup.procs").write_text("1\n")
    return root


def test_the_root_is_the_v2_mount_when_it_offers_cpu_else_v1s(tmp_path: Path) -> None:
    mount = _v2_root(tmp_path)
    assert cgroups.cpu_root(mount) == mount
    assert cgroups.cgroup_version(mount) == 2
    (mount / "cgroup.controllers").write_text("memory pids\n")  # v2 without the cpu controller
    assert cgroups.cpu_root(mount) == mount / "cpu"
    v1 = _v1_root(tmp_path / "other")
    assert cgroups.cpu_root(v1.parent) == v1  # no cgroup.controllers at the mount: v1
    assert cgroups.cgroup_version(v1) == 1
    assert cgroups.cgroup_version(tmp_path / "nowhere") is None


def test_v2_quota_is_cpu_max_with_cpu_enabled_in_every_parent(tmp_path: Path) -> None:
    root = _v2_root(tmp_path)
    group = cgroups.make_cgroup(root / "edgeagent-lab" / "pi-1", 0.5)
    assert group == root / "edgeagent-lab" / "pi-1"
    assert (group / "cpu.max").read_text() == "5000 10000"  # half of a 10 ms period
    assert (root / "cgroup.subtree_control").read_text() == "+cpu"
    assert (root / "edgeagent-lab" / "cgroup.subtree_control").read_text() == "+cpu"
    assert not (group / "cgroup.subtree_control").exists()  # a leaf: its processes are what it limits
    assert not (group / "cpu.cfs_quota_us").exists()  # no v1 file in a v2 group
    # Under one bandwidth slice (5 ms): a longer period, as in v1; no quota: "max".
    assert (cgroups.make_cgroup(root / "edgeagent-lab" / "pi-2", 0.25).joinpath("cpu.max")).read_text() == (
        f"{round(0.25 * cgroups.cfs_period_us(0.25))} {cgroups.cfs_period_us(0.25)}"
    )
    central = cgroups.make_cgroup(root / "edgeagent-lab" / "central", None)
    assert (central / "cpu.max").read_text() == "max 10000"
    # A parent that already enables cpu is left alone (the kernel lists it as a word).
    (root / "cgroup.subtree_control").write_text("cpu memory pids\n")
    cgroups.make_cgroup(root / "edgeagent-lab" / "pi-3", 0.35)
    assert (root / "cgroup.subtree_control").read_text() == "cpu memory pids\n"


def test_v1_quota_is_cfs_quota_and_period(tmp_path: Path) -> None:
    root = _v1_root(tmp_path)
    group = cgroups.make_cgroup(root / "edgeagent-lab" / "pi-1", 0.5)
    assert (group / "cpu.cfs_quota_us").read_text() == "5000"
    assert (group / "cpu.cfs_period_us").read_text() == "10000"
    assert not (group / "cpu.max").exists()
    assert not (root / "cgroup.subtree_control").exists()
    none = cgroups.make_cgroup(root / "edgeagent-lab" / "central", 0)
    assert (none / "cpu.cfs_quota_us").read_text() == "-1"


def test_problems_name_what_is_missing_in_either_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cgroups.os, "geteuid", lambda: 0)
    assert cgroups.cgroup_problem(_v2_root(tmp_path / "a")) is None
    assert cgroups.cgroup_problem(_v1_root(tmp_path / "b")) is None
    no_cpu = _v2_root(tmp_path / "c", controllers="memory pids")
    assert cgroups.cgroup_problem(no_cpu) == f"the cpu controller in {no_cpu}/cgroup.controllers (cgroup v2)"
    assert "v1 cpu controller or a cgroup v2 hierarchy" in (cgroups.cgroup_problem(tmp_path) or "")
    monkeypatch.setattr(cgroups.os, "geteuid", lambda: 1000)
    assert cgroups.cgroup_problem(_v2_root(tmp_path / "d")) == "root"


def test_remove_finds_processes_in_v2_groups_too(tmp_path: Path) -> None:
    root = _v2_root(tmp_path)
    group = cgroups.make_cgroup(root / "edgeagent-lab" / "pi-1", 0.5)
    (group / "cgroup.procs").write_text("")  # the kernel's empty list
    assert cgroups.cgroup_pids(root / "edgeagent-lab") == []
    assert cgroups.remove_cgroups(root / "edgeagent-lab", timeout=0) == []
