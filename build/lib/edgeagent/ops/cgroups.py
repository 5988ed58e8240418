"""CPU quotas for local processes: cgroup v1 ``cpu`` groups with a CFS quota (root only).

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

CPU_ROOT = Path("/sys/fs/cgroup/cpu")  # cgroup v1, cpu controller
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
    """Why CPU quotas cannot be set here (not root, no cgroup v1 cpu controller at ``root``), or None."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    if not (root / "cpu.cfs_quota_us").is_file():
        missing.append(f"the cgroup v1 cpu controller at {root}")
    return " and ".join(missing) or None


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


def make_cgroup(path: Path, share: float | None) -> Path:
    """A cpu cgroup whose processes get at most ``share`` of one core (None or 0: no quota), over the
    period :func:`cfs_period_us` chooses."""
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
    "CPU_ROOT",
    "JOIN",
    "MIN_QUOTA_US",
    "bandwidth_slice_us",
    "cfs_period_us",
    "cgroup_pids",
    "cgroup_problem",
    "joined",
    "make_cgroup",
    "remove_cgroups",
]
