"""CPU quotas for local processes: ``cpu`` cgroups with a CFS quota (root only), cgroup v1 or v2.

Where the unified hierarchy (cgroup v2: Raspberry Pi OS, Debian 11 and later on a host) is mounted at
/sys/fs/cgroup with the ``cpu`` controller, a group is a child directory of it whose ``cpu.max`` holds
"quota period", and every group above it enables ``cpu`` for its children (``+cpu`` in
``cgroup.subtree_control``). Else the cgroup v1 ``cpu`` controller at /sys/fs/cgroup/cpu
(``cpu.cfs_quota_us``, ``cpu.cfs_period_us``), as on the machines the quotas were first measured on.

A process runs under a quota from its first instruction: a shell joins the group and then execs the
command (:func:`joined`), so nothing runs outside it. ``edgeagent demo --worker-cpu`` and the Pi lab
(``bench/pi_lab.py``) use these; the groups are theirs alone, so :func:`remove_cgroups` may kill what
still runs in them.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from pathlib import Path

CGROUP_MOUNT = Path("/sys/fs/cgroup")
V1_CPU_ROOT = CGROUP_MOUNT / "cpu"  # cgroup v1, cpu controller


def cgroup_version(root: Path) -> int | None:
    """1 for a cgroup v1 ``cpu`` group at ``root``, 2 for a cgroup v2 group, None for neither."""
    if (root / "cpu.cfs_quota_us").is_file():
        return 1
    if (root / "cgroup.controllers").is_file():
        return 2
    return None


def cpu_root(mount: Path = CGROUP_MOUNT) -> Path:
    """Where the cpu groups go: the v2 hierarchy at ``mount`` when it offers ``cpu``, else v1's."""
    try:
        if "cpu" in (mount / "cgroup.controllers").read_text().split():
            return mount
    except OSError:
        pass
    return mount / "cpu"


CPU_ROOT = cpu_root()
# A 10 ms period, not the kernel's default 100 ms: a step of a few ms then sees a steadily slower CPU,
# as on a slower device, instead of full speed until the period's quota is spent and then a long stall
# (which makes a 0.2 s timing window land on 2 periods and vary by a whole burst).
CFS_PERIOD_US = 10_000
MIN_QUOTA_US = 1_000  # the kernel refuses a smaller cpu.cfs_quota_us
# The kernel hands a group's quota to a core's run queue in slices of this many microseconds
# (kernel.sched_cfs_bandwidth_slice_us); a quota under one slice goes to one core at a time, and a
# thread that moves to the other core waits for it: measured here at 0.35 of a core, a sub-model's time
# repeated within 10 % in 57 % of 40 sub-models at the 10 ms period, 85-88 % at 20 ms.
SLICE_FILE = Path("/proc/sys/kernel/sched_cfs_bandwidth_slice_us")
DEFAULT_SLICE_US = 5_000
# The shell writes its pid into the group ($0), then execs the command ("$@") in the same process.
JOIN = 'echo $$ > "$0/cgroup.procs" && exec "$@"'


def cgroup_problem(root: Path = CPU_ROOT) -> str | None:
    """Why CPU quotas cannot be set here (not root, neither a cgroup v1 cpu controller nor a cgroup v2
    hierarchy offering ``cpu`` at ``root``), or None."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    version = cgroup_version(root)
    if version is None:
        missing.append(f"the cgroup v1 cpu controller or a cgroup v2 hierarchy at {root}")
    elif version == 2 and "cpu" not in _words(root / "cgroup.controllers"):
        missing.append(f"the cpu controller in {root}/cgroup.controllers (cgroup v2)")
    return " and ".join(missing) or None


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def bandwidth_slice_us(path: Path = SLICE_FILE) -> int:
    """The kernel's CFS bandwidth slice in microseconds (its default when the file cannot be read)."""
    try:
        return max(1, int(path.read_text().split()[0]))
    except (OSError, ValueError, IndexError):
        return DEFAULT_SLICE_US


def cfs_period_us(share: float, slice_us: int | None = None) -> int:
    """The period for a quota of ``share`` cores: :data:`CFS_PERIOD_US`, or the least multiple of it
    whose quota is at least one bandwidth slice (0.35 of a core: 20 ms, 7 ms of CPU per period)."""
    if share <= 0:
        raise ValueError(f"a CPU share must be > 0 cores, got {share}")
    least = max(MIN_QUOTA_US, bandwidth_slice_us() if slice_us is None else slice_us)
    return CFS_PERIOD_US * max(1, math.ceil(least / (share * CFS_PERIOD_US) - 1e-9))


def _hierarchy_version(path: Path) -> int:
    """The cgroup version of the hierarchy ``path`` is (or will be) in: that of its nearest ancestor that
    says (v1 when none does)."""
    for place in (path, *path.parents):
        version = cgroup_version(place)
        if version is not None:
            return version
    return 1


def _enable_cpu_above(path: Path) -> None:
    """cgroup v2: ``cpu`` enabled in ``cgroup.subtree_control`` of every group above ``path``, from the
    hierarchy's root (the topmost directory with ``cgroup.controllers``) down, the missing ones made on
    the way: a child gets only the controllers its parent enables. Such a parent must hold no processes
    of its own, which the groups made here never do; the kernel refuses (EBUSY) where one does, e.g. a
    container's root group."""
    above = list(path.parents)  # nearest first
    top = max((i for i, place in enumerate(above) if (place / "cgroup.controllers").is_file()), default=-1)
    for place in reversed(above[: top + 1]):
        place.mkdir(exist_ok=True)
        control = place / "cgroup.subtree_control"
        if "cpu" in _words(control):
            continue
        try:
            control.write_text("+cpu")
        except OSError as exc:
            reason = f"cannot enable the cpu controller in {control} ({exc.strerror})"
            raise OSError(exc.errno, reason) from exc


def make_cgroup(path: Path, share: float | None) -> Path:
    """A cpu cgroup whose processes get at most ``share`` of one core (None or 0: no quota), over the
    period :func:`cfs_period_us` chooses; in cgroup v1 or v2, whichever hierarchy ``path`` is in."""
    if _hierarchy_version(path.parent) == 2:
        _enable_cpu_above(path)
        path.mkdir(exist_ok=True)
        if not share:
            (path / "cpu.max").write_text(f"max {CFS_PERIOD_US}")
        else:
            period = cfs_period_us(share)
            (path / "cpu.max").write_text(f"{max(MIN_QUOTA_US, round(share * period))} {period}")
        return path
    path.mkdir(parents=True, exist_ok=True)
    if not share:
        (path / "cpu.cfs_quota_us").write_text("-1")
        (path / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
        return path
    period = cfs_period_us(share)
    (path / "cpu.cfs_quota_us").write_text("-1")  # a shorter period must not meet the old quota
    (path / "cpu.cfs_period_us").write_text(str(period))
    (path / "cpu.cfs_quota_us").write_text(str(max(MIN_QUOTA_US, round(share * period))))
    return path


def joined(cmd: list[str], cgroup: Path) -> list[str]:
    """``cmd`` wrapped so that it joins ``cgroup`` before it execs (its pid stays the shell's)."""
    return ["sh", "-c", JOIN, str(cgroup), *cmd]


def cgroup_pids(path: Path) -> list[int]:
    """Every process in ``path`` and the groups below it."""
    pids: list[int] = []
    for procs in sorted(path.rglob("cgroup.procs")) if path.is_dir() else []:
        with contextlib.suppress(OSError):
            pids += [int(p) for p in procs.read_text().split()]
    return pids


def remove_cgroups(path: Path, timeout: float = 10.0) -> list[int]:
    """SIGKILL what still runs in ``path`` and below (only its owner starts processes there), then
    remove the groups, deepest first. Returns the pids it had to kill."""
    killed = cgroup_pids(path)
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while cgroup_pids(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    if path.is_dir():
        for group in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                group.rmdir()
        with contextlib.suppress(OSError):
            path.rmdir()
    return killed


__all__ = [
    "CFS_PERIOD_US",
    "CGROUP_MOUNT",
    "CPU_ROOT",
    "JOIN",
    "MIN_QUOTA_US",
    "V1_CPU_ROOT",
    "bandwidth_slice_us",
    "cfs_period_us",
    "cgroup_pids",
    "cgroup_problem",
    "cgroup_version",
    "cpu_root",
    "joined",
    "make_cgroup",
    "remove_cgroups",
]
