"""The shipped units under a real systemd: a Debian container booted with systemd as PID 1.

    sudo make systemd-lab            (or: sudo .venv/bin/python bench/systemd_lab.py [--keep] [--epochs N])

1. ``systemd-nspawn`` and ``debootstrap`` (apt-get installs them if missing).
2. A Debian bookworm root file system (``debootstrap --variant=minbase --include=systemd,systemd-sysv,
   dbus,python3,python3-venv``), built once into /var/cache/edgeagent-systemd-lab/rootfs and reused; each
   run boots an overlay of it, so the cache stays clean.
3. The wheel, built from this checkout.
4. ``systemd-nspawn -D ROOT --register=no --keep-unit -b`` with the wheel and what this machine's pip
   needs to install torch 2.13.0 (its configuration files, /opt/wheels, /opt/pypi, /opt/pypi-more, the
   PIP_* variables) bound in. A oneshot unit there runs bench/systemd_lab_check.py as PID 1's child: a
   venv with torch and the wheel, the site's certificates, logins and one ``edgeagent bundle`` per
   device, the units from ``edgeagent install-service`` (broker, central, two workers), then the run:
   training, ``systemctl kill -s SIGKILL edgeagent-central`` (systemd restarts it, it resumes the run),
   ``systemctl restart`` of a worker (recovery case 2), the run's end, ``systemctl stop`` (the workers
   announce ``left``), the journal's lines; then ``systemctl poweroff``.

The container's steps print as they happen; the last line says whether every step held. The container
is stopped and its overlay removed on any exit (``--keep`` keeps the overlay for a look).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path("/var/cache/edgeagent-systemd-lab")
ROOTFS = CACHE / "rootfs"
PACKAGES = "systemd,systemd-sysv,dbus,python3,python3-venv"
PIP_TREES = ("/opt/wheels", "/opt/pypi", "/opt/pypi-more")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CHECK_UNIT = """[Unit]
Description=edgeagent systemd lab: install, start, fault, stop
After=multi-user.target dbus.service
Wants=dbus.service

[Service]
Type=oneshot
Environment=LAB_EPOCHS={epochs} PYTHONUNBUFFERED=1 {pip_env}
ExecStart=/usr/bin/python3 /lab/check.py install
ExecStopPost=/bin/systemctl poweroff --no-block
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec={timeout}

[Install]
WantedBy=multi-user.target
"""


def log(text: str) -> None:
    print(f"systemd-lab: {text}", flush=True)


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, text=True, **kw)  # type: ignore[call-overload]


def ensure_tools() -> None:
    missing = [
        p
        for p, tool in (("systemd-container", "systemd-nspawn"), ("debootstrap", "debootstrap"))
        if not shutil.which(tool)
    ]
    if missing:
        log(f"installing {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        run(["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=600", *missing], env=env)


def ensure_rootfs() -> None:
    """Build the cached root file system once; a half-built one (an interrupted debootstrap) is redone."""
    if (ROOTFS / "usr/lib/systemd/systemd").exists() and (ROOTFS / "usr/lib/python3/dist-packages").exists():
        log(f"reusing the root file system in {ROOTFS}")
        return
    partial = CACHE / "rootfs.partial"
    shutil.rmtree(partial, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    log(f"debootstrap bookworm into {ROOTFS} (about 2 minutes, once)")
    started = time.monotonic()
    with (CACHE / "debootstrap.log").open("w") as out:
        run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={PACKAGES}",
                "bookworm",
                str(partial),
                "http://deb.debian.org/debian",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    partial.rename(ROOTFS)
    log(f"root file system ready in {time.monotonic() - started:.0f} s")


def build_wheel(into: Path) -> Path:
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(into),
            str(REPO),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    (wheel,) = into.glob("edgeagent-*.whl")
    return wheel


def pip_config_files() -> list[Path]:
    """The configuration files this machine's pip reads (``pip config debug``), to bind in as they are."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "debug"], capture_output=True, text=True
    ).stdout
    return [Path(m) for m in re.findall(r"^\s+(/\S+), exists: True$", out, re.MULTILINE)]


def prepare(root: Path, work: Path, epochs: int, timeout: float) -> list[str]:
    """The overlay's extra files (the check unit, the host name) and nspawn's bind mounts."""
    (work / "wheel").mkdir()
    wheel = build_wheel(work / "wheel")
    log(f"built {wheel.name}")
    out = work / "out"
    out.mkdir()
    shutil.copyfile(REPO / "bench" / "systemd_lab_check.py", work / "check.py")
    pip_env = " ".join(f"{k}={v}" for k, v in os.environ.items() if k.startswith("PIP_") and " " not in v)
    unit = root / "etc/systemd/system/edgeagent-lab.service"
    unit.write_text(CHECK_UNIT.format(epochs=epochs, pip_env=pip_env, timeout=int(timeout)))
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / "edgeagent-lab.service").symlink_to("/etc/systemd/system/edgeagent-lab.service")
    (root / "etc/hostname").write_text("central\n")
    (root / "etc/hosts").write_text("127.0.0.1 localhost central central.local\n::1 localhost\n")
    binds = [
        f"--bind-ro={work / 'wheel'}:/lab/wheel",
        f"--bind-ro={work / 'check.py'}:/lab/check.py",
        f"--bind={out}:/lab/out",
    ]
    for tree in PIP_TREES:
        if Path(tree).is_dir():
            binds.append(f"--bind-ro={tree}")
    for conf in pip_config_files():
        (root / conf.parent.relative_to("/")).mkdir(parents=True, exist_ok=True)
        binds.append(f"--bind-ro={conf}")
    # The CA bundle pip is told to trust (PIP_CERT, cert = ...): this machine's may hold a proxy's CA
    # the container's bundle lacks.
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    certs = {os.environ.get("PIP_CERT", ""), *re.findall(r"cert='([^']+)'", listed)}
    for cert in sorted(c for c in certs if c and Path(c).is_file()):
        (root / Path(cert).parent.relative_to("/")).mkdir(parents=True, exist_ok=True)
        binds.append(f"--bind-ro={cert}")
    xdg = Path("/etc/xdg/pip")
    if xdg.is_dir():  # the constraints file next to its pip.conf
        (root / "etc/xdg/pip").mkdir(parents=True, exist_ok=True)
        binds = [b for b in binds if not b.startswith("--bind-ro=/etc/xdg/pip/")] + [f"--bind-ro={xdg}"]
    return binds


def boot(root: Path, binds: list[str], timeout: float, console_log: Path) -> int | None:
    """Boot the container; print its lab lines as they come; stop it after ``timeout`` s."""
    argv = [
        "systemd-nspawn",
        "-q",
        "-D",
        str(root),
        "--register=no",
        "--keep-unit",
        "--console=read-only",
        *binds,
        "-b",
    ]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    assert proc.stdout is not None
    try:
        with console_log.open("w") as keep:
            for raw in proc.stdout:
                line = ANSI.sub("", raw.decode(errors="replace")).rstrip()
                keep.write(line + "\n")
                keep.flush()
                if "systemd-lab: " in line:
                    print(line[line.index("systemd-lab: ") :], flush=True)
        code = proc.wait()
    finally:
        killer.cancel()
        if proc.poll() is None:  # an exception here (Ctrl-C): the container goes too
            proc.kill()
            proc.wait()
    return None if code == -signal.SIGKILL else code  # None: stopped after the timeout


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=6, help="Epochs of the lab's run (the MLP on digits).")
    parser.add_argument("--timeout", type=float, default=2400, help="Seconds the container may run in all.")
    parser.add_argument("--keep", action="store_true", help="Keep the overlay and its logs.")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit(
            "systemd-lab: needs root (debootstrap, overlay mounts, systemd-nspawn): sudo make systemd-lab"
        )
    ensure_tools()
    ensure_rootfs()
    work = Path(tempfile.mkdtemp(prefix="edgeagent-systemd-lab.", dir="/var/tmp"))
    merged = work / "root"
    mounted = False
    steps: list[dict[str, object]] = []
    expected = (
        "install",
        "site",
        "units",
        "start",
        "training",
        "central SIGKILL",
        "worker restart",
        "run finished",
        "stop",
        "journal",
    )
    try:
        for d in ("upper", "ovl-work", "root"):
            (work / d).mkdir()
        run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={ROOTFS},upperdir={work / 'upper'},workdir={work / 'ovl-work'}",
                str(merged),
            ]
        )
        mounted = True
        binds = prepare(merged, work, args.epochs, args.timeout)
        log(f"booting the container (systemd as PID 1); console in {work / 'console.log'}")
        started = time.monotonic()
        code = boot(merged, binds, args.timeout, work / "console.log")
        log(
            f"the container powered off after {time.monotonic() - started:.0f} s (nspawn exit {code})"
            if code is not None
            else f"the container was stopped after {args.timeout:.0f} s"
        )
        results = work / "out" / "steps.jsonl"
        if results.exists():
            steps = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    finally:
        if mounted and subprocess.run(["umount", str(merged)]).returncode != 0:
            subprocess.run(["umount", "-l", str(merged)])  # busy: detach it now, freed when idle
        if args.keep:
            log(f"kept {work}")
        else:
            keep = CACHE / "last-run"
            shutil.rmtree(keep, ignore_errors=True)
            keep.mkdir(parents=True, exist_ok=True)
            for f in [work / "console.log", *(work / "out").glob("*")]:
                if f.is_file():
                    shutil.copy(f, keep / f.name)
            shutil.rmtree(work, ignore_errors=True)
            log(f"logs of this run (console, steps, each unit's journal) in {keep}")
    print()
    for s in steps:
        print(f"  {'PASS' if s['ok'] else 'FAIL'}  {s['step']:<16} {s['detail']}  ({s['seconds']} s)")
    names = [s["step"] for s in steps]
    missing = [e for e in expected if e not in names]
    for name in missing:
        print(f"  FAIL  {name:<16} not reached")
    passed = sum(bool(s["ok"]) for s in steps if s["step"] in expected)
    verdict = "PASS" if passed == len(expected) and not missing and all(s["ok"] for s in steps) else "FAIL"
    print(f"systemd-lab: {verdict} ({passed}/{len(expected)} steps)")
    sys.exit(0 if verdict == "PASS" else 1)


if __name__ == "__main__":
    main()
