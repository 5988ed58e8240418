"""The checks of ``make systemd-lab``, run inside the container by a oneshot unit (systemd is PID 1).

Phase ``install`` (the system's python3, standard library only): a venv at /opt/edgeagent/venv with
torch 2.13.0 and the wheel, the site's certificates and logins, a bundle per device, the units from
``edgeagent install-service``. Phase ``run`` (the venv's python, so edgeagent's own MQTT client): start
the broker, the central node and two workers as systemd services and follow what the cluster says on
the broker (events, statuses, announcements) through an observer login. Every wait is for a message or
a unit state; its deadline is derived from what the run measured so far, with a floor.

Each step appends one JSON line to /lab/out/steps.jsonl: {"step", "ok", "detail", "seconds"}; the host
(bench/systemd_lab.py) prints them. The unit powers the container off afterwards, pass or fail.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

OUT = Path("/lab/out")
VENV = Path("/opt/edgeagent/venv")
EA = VENV / "bin" / "edgeagent"
ETC = Path("/etc/edgeagent")
WORKERS = ("pi-1", "pi-2")
CLUSTER = "lab"
# Every device emulated this many times slower: the default MLP trains 6 epochs in 3 s on a quiet
# machine, too fast to kill the central node and restart a worker mid-run; 10x is about 0.1 s a batch.
SLOWDOWN = 10
SERVICES = ("edgeagent-broker", "edgeagent-central", *(f"edgeagent-worker-{w}" for w in WORKERS))


def say(text: str) -> None:
    print(f"systemd-lab: {text}", flush=True)


def record(step: str, ok: bool, detail: str, started: float) -> bool:
    seconds = round(time.monotonic() - started, 1)
    with (OUT / "steps.jsonl").open("a") as f:
        f.write(json.dumps({"step": step, "ok": ok, "detail": detail, "seconds": seconds}) + "\n")
    say(f"{'PASS' if ok else 'FAIL'} {step}: {detail} ({seconds} s)")
    return ok


def sh(*argv: str | Path, check: bool = True, timeout: float = 900) -> str:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout


# -- phase install: system python, standard library --------------------------------------------------


def install() -> bool:
    t = time.monotonic()
    wheel = sorted(glob.glob("/lab/wheel/edgeagent-*.whl"))[-1]
    sh(sys.executable, "-m", "venv", VENV)
    pip = VENV / "bin" / "pip"
    # torch first, the CPU build this machine's pip configuration provides (/opt/wheels): any other
    # torch requirement would pull the CUDA wheels.
    sh(pip, "install", "-q", "torch==2.13.0")
    sh(pip, "install", "-q", f"{wheel}[all]")
    version = sh(EA, "--version").strip()
    if not record("install", EA.is_file(), f"venv + torch 2.13.0 + {Path(wheel).name}: {version}", t):
        return False

    t = time.monotonic()
    tls, creds, pw = ETC / "tls", ETC / "broker", Path("/root/pw")
    sh(EA, "certs", "--certs-dir", tls, "--host", "central.local", "--device", "central", "--device", "watch")
    sh(
        EA,
        "credentials",
        "add",
        "--credentials-dir",
        creds,
        "--cluster",
        CLUSTER,
        "--role",
        "central",
        "--password-out",
        pw,
        "central",
    )
    sh(
        EA,
        "credentials",
        "add",
        "--credentials-dir",
        creds,
        "--cluster",
        CLUSTER,
        "--role",
        "observer",
        "--password-out",
        pw,
        "watch",
    )
    shutil.copyfile(pw / "central.password", ETC / "central-password")
    os.chmod(ETC / "central-password", 0o600)
    for device in WORKERS:
        # The archive a Pi gets, unpacked where its unit reads it (two workers on one machine: a
        # directory each).
        archive = Path(f"/root/{device}.tar.gz")
        where = ETC / device
        sh(
            EA,
            "bundle",
            device,
            "--broker",
            "mqtts://central.local:8883",
            "--cluster",
            CLUSTER,
            "--credentials",
            creds,
            "--tls",
            tls,
            "--etc",
            where,
            "-o",
            archive,
        )
        where.mkdir(parents=True, exist_ok=True)
        sh("tar", "-xzf", archive, "-C", where)
        with (where / "worker.yaml").open("a") as f:
            f.write(f"slowdown: {SLOWDOWN}\n")
    central_yaml(ETC / "central.yaml")
    files = sorted(str(p.relative_to(ETC)) for p in ETC.rglob("*") if p.is_file())
    record("site", True, f"certs, logins, bundles for {', '.join(WORKERS)}: {len(files)} files in {ETC}", t)

    t = time.monotonic()
    sh(EA, "install-service", "broker")
    sh(EA, "install-service", "central")
    for device in WORKERS:
        sh(EA, "install-service", "worker", "--etc", ETC / device, "--name", f"edgeagent-worker-{device}")
    units = [Path(f"/etc/systemd/system/{s}.service") for s in SERVICES]
    text = "".join(u.read_text() for u in units)
    verify = subprocess.run(["systemd-analyze", "verify", *map(str, units)], capture_output=True, text=True)
    docs = re.findall(r"^Documentation=file://(\S+)$", text, re.MULTILINE)
    ok = (
        f"ExecStart={EA} " in text
        and "/opt/edgeagent/venv/lib/python3.11" not in text.replace(str(VENV / "lib"), "")
        and verify.returncode == 0
        and len(docs) == len(units)
        and all(Path(d).is_file() for d in docs)
    )
    sh("systemctl", "daemon-reload")
    # systemd's exposure rating of each unit (0 safest, 10 worst).
    rated = sh("systemd-analyze", "security", "--no-pager", *SERVICES, check=False)
    security = [
        f"{u} {x}" for u, x in re.findall(r"^(edgeagent-\S+)\.service\s+([0-9.]+)", rated, re.MULTILINE)
    ]
    detail = f"{len(units)} units from install-service, systemd-analyze verify rc {verify.returncode}"
    detail += f"{(': ' + verify.stderr.strip()[:300]) if verify.stderr.strip() else ''}; docs {docs[0]}"
    if security:
        detail += "; systemd-analyze security exposure: " + ", ".join(security)
    return record("units", ok, detail, t)


def central_yaml(target: Path) -> None:
    """The shipped central.yaml with the lab's training: the default MLP (the shipped MobileNetV2 is
    minutes per epoch on two shared cores), a checkpoint every 20 batches, the lab's cluster."""
    text = (
        Path(glob.glob(str(VENV / "lib/python3*/site-packages/edgeagent/share/configs/central.yaml"))[0])
    ).read_text()
    epochs = os.environ.get("LAB_EPOCHS", "6")
    for pattern, value in (
        (r"^cluster: .*$", f"cluster: {CLUSTER}"),
        (r"^threads: .*$", "threads: 1"),
        (r"^  model: .*$", "  model: mlp"),
        (r"^  model_options: .*$", "  model_options: {}"),
        (r"^  epochs: .*$", f"  epochs: {epochs}"),
    ):
        text, n = re.subn(pattern, value, text, count=1, flags=re.MULTILINE)
        if n != 1:
            raise RuntimeError(f"central.yaml has no line {pattern}")
    target.write_text(text + f"global_every: 20\nchain_every: 10\nslowdown: {SLOWDOWN}\n")


# -- phase run: the venv's python, edgeagent's MQTT client -------------------------------------------


class Wire:
    """What the cluster says on the broker (events, statuses, announcements) as it arrives."""

    def __init__(self) -> None:
        from edgeagent.protocol.topics import Family, Topics
        from edgeagent.transport.mqtt import MqttTransport, TlsOptions

        self.seen: list[tuple[float, str, Any]] = []
        self.changed = threading.Condition()
        password = Path("/root/pw/watch.password").read_text().strip()
        tls = TlsOptions(str(ETC / "tls/ca.pem"), str(ETC / "tls/watch.pem"), str(ETC / "tls/watch.key"))
        url = f"mqtts://watch:{password}@central.local:8883"
        self.transport = MqttTransport(url, "lab-watch", tls=tls)
        topics = Topics(CLUSTER)
        for pattern in (
            topics.fixed(Family.EVENTS),
            topics.devices(Family.ANNOUNCE),
            topics.devices(Family.STATUS),
        ):
            self.transport.subscribe(pattern, self._on)

    def _on(self, topic: str, payload: bytes) -> None:
        from edgeagent.errors import ProtocolError
        from edgeagent.protocol.wire import decode

        try:
            sender, msg = decode(payload)
        except ProtocolError:
            return
        with self.changed:
            self.seen.append((time.monotonic(), sender, msg))
            self.changed.notify_all()

    def wait(self, match: Callable[[str, Any], bool], timeout: float, after: float = 0.0) -> Any:
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for t, sender, msg in self.seen:
                    if t >= after and match(sender, msg):
                        return msg
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(min(left, 1.0))


def event(name: str, **want: Any) -> Callable[[str, Any], bool]:
    def match(sender: str, msg: Any) -> bool:
        return (
            type(msg).__name__ == "Event"
            and msg.name == name
            and all(msg.details.get(k) == v for k, v in want.items())
        )

    return match


def checkpoint_after(version: int) -> Callable[[str, Any], bool]:
    return lambda s, m: (
        type(m).__name__ == "Event" and m.name == "checkpoint" and m.details["version"] > version
    )


def status(device: str, state: str) -> Callable[[str, Any], bool]:
    return lambda s, m: type(m).__name__ == "Status" and s == device and m.state == state


def show(unit: str, prop: str) -> str:
    return sh("systemctl", "show", "-P", prop, unit).strip()


def journal(unit: str) -> str:
    return sh("journalctl", "-u", unit, "-o", "cat", "--no-pager", check=False)


def run() -> bool:
    steps_ok = True

    t = time.monotonic()
    # Type=notify: `systemctl start` returns once the service said READY=1 (or fails). The broker
    # first, and the observer on it, so that it hears the run from its first event (a quiet machine
    # trained all 6 epochs before an observer started after the units had connected).
    broker, *others = SERVICES
    started = subprocess.run(
        ["systemctl", "start", f"{broker}.service"], capture_output=True, text=True, timeout=300
    )
    wire = Wire()
    if not wire.transport.wait_connected(30):
        return record("start", False, "the observer cannot reach the broker", t)
    more = subprocess.run(
        ["systemctl", "start", *(f"{s}.service" for s in others)], capture_output=True, text=True, timeout=300
    )
    started = subprocess.CompletedProcess(
        more.args, started.returncode or more.returncode, "", started.stderr + more.stderr
    )
    states = {s: show(s, "ActiveState") for s in SERVICES}
    kinds = {s: show(s, "Type") for s in SERVICES}
    # The limits as systemd applies them: MemoryMax in bytes, a system call filter in force.
    limits = {s: show(s, "MemoryMax") for s in SERVICES}
    filtered = all(show(s, "SystemCallFilter") for s in SERVICES)
    ok = (
        started.returncode == 0
        and set(states.values()) == {"active"}
        and set(kinds.values()) == {"notify"}
        and all(v.isdigit() for v in limits.values())
        and filtered
    )
    record(
        "start",
        ok,
        f"{', '.join(f'{s} {v}' for s, v in states.items())} (Type=notify: READY=1 came); MemoryMax "
        f"{', '.join(f'{int(v) >> 20} MiB' if v.isdigit() else v for v in limits.values())}; "
        f"SystemCallFilter {'in force' if filtered else 'missing'}"
        f"{started.stderr.strip()[:300]}",
        t,
    )
    if not ok:
        return False

    # The first checkpoint (version 20): the run trains. Its time sets the deadlines that follow.
    t = time.monotonic()
    first = wire.wait(event("checkpoint", version=20), timeout=600)
    if first is None:
        return record(
            "training",
            False,
            f"no checkpoint 20 within 600 s; central: {journal('edgeagent-central')[-1500:]}",
            t,
        )
    per_batch = (time.monotonic() - t) / 20
    deadline = lambda batches, floor: max(floor, 4 * per_batch * batches)  # noqa: E731
    run_id = first.run_id
    record(
        "training",
        True,
        f"run {run_id}: checkpoint 20 after {time.monotonic() - t:.0f} s "
        f"({per_batch:.2f} s/batch, start-up included)",
        t,
    )

    # SIGKILL the central node: Restart=on-failure brings it back after RestartSec; it resumes the
    # same run from its newest checkpoint.
    t = time.monotonic()
    pid = show("edgeagent-central", "MainPID")
    sh("systemctl", "kill", "-s", "SIGKILL", "edgeagent-central")
    resumed = wire.wait(event("run-resumed"), timeout=deadline(40, 180), after=t)
    progressed = resumed and wire.wait(
        lambda s, m: checkpoint_after(resumed.details["version"])(s, m) and m.run_id == run_id,
        timeout=deadline(40, 240),
        after=t,
    )
    restarts = show("edgeagent-central", "NRestarts")
    ok = bool(resumed and progressed and resumed.run_id == run_id and restarts == "1")
    steps_ok &= record(
        "central SIGKILL",
        ok,
        f"pid {pid} killed; restarted by systemd (NRestarts={restarts}), resumed run "
        f"{resumed.run_id if resumed else '?'} "
        f"from version {resumed.details.get('version') if resumed else '?'}, "
        f"then checkpoint {progressed.details['version'] if progressed else 'none'}",
        t,
    )

    # A worker restarted (systemctl restart): it comes back with its id and the central node takes it
    # back (recovery case 2).
    t = time.monotonic()
    sh("systemctl", "restart", "edgeagent-worker-pi-2")
    recovered = wire.wait(
        lambda s, m: type(m).__name__ == "Event" and m.name == "recovery" and m.details.get("case") == 2,
        timeout=deadline(60, 240),
        after=t,
    )
    after = recovered and wire.wait(
        checkpoint_after(recovered.details.get("rolled_back_to", 0)), timeout=deadline(40, 240), after=t
    )
    ok = bool(recovered and after and "pi-2" in recovered.details.get("restarted", []))
    steps_ok &= record(
        "worker restart",
        ok,
        f"recovery case {recovered.details.get('case') if recovered else '?'}, restarted "
        f"{recovered.details.get('restarted') if recovered else '?'}, then checkpoint "
        f"{after.details['version'] if after else 'none'}",
        t,
    )

    # The run ends: the central node exits 0 and stays down (Restart=on-failure); its report is in its
    # state directory (central.yaml's relative `report: report.json`, WorkingDirectory=%S/...).
    t = time.monotonic()
    epochs = int(os.environ.get("LAB_EPOCHS", "6"))
    done = wire.wait(status("central", "left"), timeout=deadline(44 * epochs, 300), after=t)
    end = time.monotonic() + 60
    while show("edgeagent-central", "ActiveState") not in ("inactive", "failed") and time.monotonic() < end:
        wire.wait(lambda s, m: False, timeout=1)  # the unit's state follows the process's exit
    state = show("edgeagent-central", "ActiveState")
    result = show("edgeagent-central", "Result")
    report_path = Path("/var/lib/edgeagent-central/report.json")
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    ok = bool(done and state == "inactive" and result == "success" and report.get("run_id") == run_id)
    acc = report.get("final_accuracy", report.get("accuracy", "?"))
    steps_ok &= record(
        "run finished",
        ok,
        f"central {state} ({result}), {report_path}: run {report.get('run_id')}, "
        f"{report.get('epochs', '?')} epochs, accuracy {acc}",
        t,
    )

    # Stop everything: each worker announces `left`.
    t = time.monotonic()
    sh("systemctl", "stop", *(f"edgeagent-worker-{w}" for w in WORKERS))
    left = {w: wire.wait(status(w, "left"), timeout=30, after=t) is not None for w in WORKERS}
    sh("systemctl", "stop", "edgeagent-broker")
    wire.transport.close()
    states = {s: show(s, "ActiveState") for s in SERVICES}
    ok = all(left.values()) and set(states.values()) == {"inactive"}
    steps_ok &= record("stop", ok, f"left: {left}; {', '.join(f'{s} {v}' for s, v in states.items())}", t)

    # The journal: one record per line, no terminal escapes, no wrapped records.
    t = time.monotonic()
    text = "".join(journal(s) for s in SERVICES)
    escapes = text.count("\x1b[")
    tracebacks = text.count("Traceback (most recent call last)")
    lines = text.count("\n")
    ok = escapes == 0 and tracebacks == 0 and lines > 0
    sample = [
        ln for ln in journal("edgeagent-central").splitlines() if "resuming" in ln or "recovered" in ln
    ][:2]
    steps_ok &= record(
        "journal", ok, f"{lines} lines, {escapes} terminal escapes, {tracebacks} tracebacks; e.g. {sample}", t
    )
    return steps_ok


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    phase = sys.argv[1] if len(sys.argv) > 1 else "install"
    try:
        if phase == "install":
            if install():
                os.execv(str(VENV / "bin" / "python"), [str(VENV / "bin" / "python"), __file__, "run"])
        else:
            run()
    except Exception as exc:  # a step that crashed is a failed step, with its reason
        record(f"{phase} (crashed)", False, f"{type(exc).__name__}: {exc}"[:2000], time.monotonic())
    finally:
        for service in SERVICES:
            (OUT / f"{service}.journal").write_text(journal(service))


if __name__ == "__main__":
    main()
