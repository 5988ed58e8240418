"""A Pi lab on one machine: each device in its own network namespace, behind a shaped link and a CPU quota.

    sudo make pi-lab                      (or: sudo .venv/bin/python bench/pi_lab.py [options]; root only)

What it builds, and removes again at exit, on Ctrl-C, and at the next start after a crashed run:

    root namespace                                 bridge eapl-br        namespace eapl-pi-N (each device)
    edgeagent broker   10.213.0.1  (logins)  <-->  10.213.0.0/24  <-->   edgeagent worker --device-id pi-N
    edgeagent central  (stage 0, the data)         veth + tc tbf         10.213.0.1N, CPU quota (cgroup v1)

* **Links.** Every device's veth pair is rate-limited with ``tc tbf`` in both directions: what it sends
  (its end of the pair) and what it receives (the bridge's end); ``--delay-ms`` adds ``netem`` delay
  each way where the kernel has ``sch_netem`` (the script says when it has not).
* **CPU.** Every device's processes run in a cgroup v1 ``cpu`` group with a CFS quota, e.g. a quarter
  of a core, different per device (``--cpu 25,35,50``).
* **The central node stays in the root namespace, with the broker**, as on a real site: the broker runs
  on the central node (README "Running on real devices", docs/deployment.md), so the central node
  reaches it over loopback; a shaped link between the two would model a network that is not there.
  Both run in the lab's ``central`` cgroup, without a quota unless ``--central-cpu`` is given (the
  central node is normally the laptop or the strongest device).
* **Logins.** The embedded broker listens on the bridge only, which it does only with logins: every
  device, the central node and the lab's progress observer get a throw-away login and topic rights
  (``edgeagent.cli.demo.throwaway_logins``, as ``edgeagent demo --secure`` does).

The run: central + 3 workers train ``mobilenetv2`` on ``synthetic:N:3x32x32:10`` (N = 10,000: 2,000 test
images at the default test fraction of 0.2) for 3 epochs. Two faults, each deterministic:

* ``--kill-mid-epoch pi-1@125``: pi-1 kills itself (SIGKILL) when batch 125 starts its backward pass,
  the middle of epoch 1. With ``--restart`` (default) the lab starts it again with its id after
  ``--restart-delay`` s (systemd's ``Restart=on-failure``, ``RestartSec=5`` in
  systemd/edgeagent-worker.service), without the kill flag: recovery case 2.
* ``--kill-in-eval pi-2@12``: pi-2 kills itself at its 12th evaluation batch (the middle of the second
  evaluation: 8 batches of 256 per evaluation) and stays dead: recovery case 3.

Deadlines: none of the central node's timers may be tripped by a slow but live device. The lab
measures, once at the start, how long a worker takes to start inside the quota of the worker it will
restart, and derives from it the window in which that worker may come back with its id
(``restart_window``, or the probe window on an edgeagent without one); the start-up timer and, on an
edgeagent without derived deadlines, the batch timer are scaled by ``1 / smallest CPU share``. The
values are printed before the run (docs/pi_lab.md).

At the start the lab also checks that the shaping and the quotas apply: TCP round trip and throughput
from inside a device's namespace, and a CPU-bound loop inside each device's cgroup, against the same
from the root namespace. At the end it prints the run's figures from the central node's JSON report
(``--report``; plots beside it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import math
import os
import secrets
import shlex
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.netlab import (
    NetnsLink,
    add_bridge,
    add_link,
    in_netns,
    netns_names,
    remove_bridge,
    remove_link,
    sh,
    shape,
)
from edgeagent.broker.certs import init_site
from edgeagent.broker.credentials import CredentialStore
from edgeagent.cli.demo import throwaway_logins, tls_files, worker_command
from edgeagent.config import TrainConfig
from edgeagent.errors import ProtocolError
from edgeagent.ops.cgroups import CPU_ROOT, cgroup_problem, joined, make_cgroup, remove_cgroups
from edgeagent.protocol.messages import Event, Metrics
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode
from edgeagent.transport.mqtt import BrokerUrl, MqttTransport, TlsOptions

PREFIX = "eapl"  # every namespace, interface and cgroup of the lab starts with this
BRIDGE, BRIDGE_IP, SUBNET_BITS = f"{PREFIX}-br", "10.213.0.1", 24
LAB_CGROUP = CPU_ROOT / PREFIX
LOCK_FILE = Path("/run/edgeagent-pi-lab.lock")
# The run uses TrainConfig's defaults for these; the lab needs them to place the faults.
_TRAIN = TrainConfig()
TEST_FRACTION, BATCH, EVAL_BATCH = _TRAIN.test_fraction, _TRAIN.batch_size, _TRAIN.eval_batch_size

_t0 = time.monotonic()


def say(text: str) -> None:
    """The lab's own lines: elapsed time, then what happens (the roles log with their device id)."""
    elapsed = int(time.monotonic() - _t0)
    print(f"[lab {elapsed // 60:02d}:{elapsed % 60:02d}] {text}", flush=True)


# -- the devices ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Device:
    """One emulated Pi: its id, its share of one core and its link to the bridge."""

    id: str
    cpu: float  # share of one core, e.g. 0.25
    link: NetnsLink

    @property
    def cgroup(self) -> Path:
        return LAB_CGROUP / self.id


def make_devices(cpus: list[float]) -> list[Device]:
    devices = []
    for i, cpu in enumerate(cpus, start=1):
        link = NetnsLink(
            f"{PREFIX}-pi-{i}",
            f"{PREFIX}{i}h",
            f"{PREFIX}{i}n",
            f"10.213.0.{10 + i}/{SUBNET_BITS}",
            bridge=BRIDGE,
        )
        devices.append(Device(f"pi-{i}", cpu, link))
    return devices


# -- processes -------------------------------------------------------------------------------------


def spawn(
    cmd: list[str],
    *,
    cgroup: Path,
    ns: str | None = None,
    env: dict[str, str] | None = None,
    stdout: int | IO[Any] | None = None,
) -> subprocess.Popen[str]:
    """Start ``cmd`` in ``cgroup`` (and network namespace ``ns``).

    The shell joins the cgroup and then execs, so the command runs under the quota from its first
    instruction. A new session keeps the terminal's Ctrl-C away from the roles: the lab stops them.
    """
    return subprocess.Popen(
        joined(in_netns(ns, *cmd), cgroup),
        env=env,
        stdout=stdout,
        text=True,
        start_new_session=True,
    )


def stop(procs: list[subprocess.Popen[str]], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, proc: subprocess.Popen[str], timeout: float) -> None:
    """Until something listens on ``host:port`` (the broker has no other readiness signal)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the broker exited ({proc.returncode}) before it listened on {host}:{port}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the broker did not listen on {host}:{port} within {timeout:.0f} s")


def role_env(**extra: str) -> dict[str, str]:
    """The roles' environment: unbuffered; rich's log lines one per line when the output is not a terminal."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **extra)
    if not sys.stderr.isatty():
        env.setdefault("COLUMNS", "200")
    return env


# -- the lab: set-up, clean-up ---------------------------------------------------------------------


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """One lab at a time: what another run left behind is removed only when no run holds the lock."""
    with open(LOCK_FILE, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"another pi-lab run holds {LOCK_FILE}; wait for it or stop it") from None
        yield


def remove_lab(devices: list[Device]) -> list[str]:
    """Remove everything a lab (this one, or an earlier one that crashed) may have left; say what."""
    found = []
    killed = remove_cgroups(LAB_CGROUP)
    if killed:
        found.append(f"{len(killed)} process{'es' if len(killed) > 1 else ''}")
    names = {d.link.ns for d in devices} | {n for n in netns_names() if n.startswith(f"{PREFIX}-")}
    for ns in sorted(names & set(netns_names())):
        found.append(f"namespace {ns}")
    for d in devices:
        remove_link(d.link)
    for ns in names:
        sh("ip", "netns", "del", ns, check=False)
    links = [line.split(":")[1].strip().split("@")[0] for line in sh("ip", "-o", "link").stdout.splitlines()]
    for name in (n for n in links if n.startswith(PREFIX)):
        found.append(f"interface {name}")
        sh("ip", "link", "del", name, check=False)
    remove_bridge(BRIDGE)
    return found


def build_lab(devices: list[Device], *, mbps: float, delay_ms: float, central_cpu: float | None) -> bool:
    """Bridge, namespaces, shaped links, cgroups. Returns whether the delay applies (see netlab.shape)."""
    add_bridge(BRIDGE, f"{BRIDGE_IP}/{SUBNET_BITS}")
    delayed = True
    for d in devices:
        add_link(d.link)
        # Uplink: what the device sends leaves through its end; downlink: the bridge's end sends to it.
        delayed &= shape(d.link.ns_if, mbps=mbps, delay_ms=delay_ms, ns=d.link.ns, latency="400ms")
        delayed &= shape(d.link.host_if, mbps=mbps, delay_ms=delay_ms, latency="400ms")
        make_cgroup(d.cgroup, d.cpu)
    make_cgroup(LAB_CGROUP / "central", central_cpu)
    return delayed


# -- checks: do the shaping and the quotas apply? ----------------------------------------------------

# Runs inside a device's namespace: round trips, then N bytes each way to the lab's echo server.
LINK_CHECK = r"""
import socket, struct, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.create_connection((host, port), timeout=60)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def recv_exact(k):
    buf = bytearray()
    while len(buf) < k:
        chunk = s.recv(min(1 << 20, k - len(buf)))
        if not chunk:
            raise SystemExit("echo server closed the connection")
        buf += chunk
rtts = []
for _ in range(10):
    t = time.perf_counter(); s.sendall(b"r"); recv_exact(1); rtts.append(time.perf_counter() - t)
t = time.perf_counter(); s.sendall(b"u" + struct.pack("!Q", n) + bytes(n)); recv_exact(1)
up = time.perf_counter() - t
t = time.perf_counter(); s.sendall(b"d" + struct.pack("!Q", n)); recv_exact(n)
down = time.perf_counter() - t
print(sorted(rtts)[len(rtts) // 2], up, down)
"""

# Runs inside a cgroup: half a second of CPU-bound work; prints the CPU seconds per wall second.
CPU_CHECK = r"""
import time
t, c = time.perf_counter(), time.process_time()
while time.process_time() - c < 0.5:
    pass
print((time.process_time() - c) / (time.perf_counter() - t))
"""

# Runs inside a cgroup: what a worker imports before it can announce itself (its start-up).
STARTUP_CHECK = r"""
import time
t = time.perf_counter()
import torch, edgeagent.roles.worker
print(time.perf_counter() - t)
"""


class EchoServer:
    """The root namespace's end of LINK_CHECK: ``r`` -> echo; ``u``+len+bytes -> ack; ``d``+len -> bytes."""

    def __init__(self, host: str) -> None:
        self.sock = socket.create_server((host, 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    @staticmethod
    def _handle(conn: socket.socket) -> None:
        def recv_exact(k: int) -> bytes:
            buf = bytearray()
            while len(buf) < k:
                chunk = conn.recv(min(1 << 20, k - len(buf)))
                if not chunk:
                    raise ConnectionError("closed")
                buf += chunk
            return bytes(buf)

        with conn, contextlib.suppress(OSError):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                cmd = recv_exact(1)
                if cmd == b"r":
                    conn.sendall(b"r")
                elif cmd == b"u":
                    recv_exact(struct.unpack("!Q", recv_exact(8))[0])
                    conn.sendall(b"k")
                elif cmd == b"d":
                    conn.sendall(bytes(struct.unpack("!Q", recv_exact(8))[0]))

    def close(self) -> None:
        self.sock.close()


@dataclasses.dataclass(frozen=True)
class LinkFigures:
    rtt: float  # s, median of 10 round trips of one byte
    up_mbps: float
    down_mbps: float


@dataclasses.dataclass(frozen=True)
class CpuFigures:
    share: float  # CPU seconds per wall second of CPU_CHECK
    throttled: int  # CFS periods in which the quota stopped the group, of
    periods: int  # the periods in which it ran


def _run_check(cmd: list[str], what: str, timeout: float = 300) -> list[float]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed: {done.stderr.strip()[-500:]}")
    return [float(v) for v in done.stdout.split()]


def check_link(ns: str | None, server: EchoServer, nbytes: int) -> LinkFigures:
    rtt, up, down = _run_check(
        in_netns(ns, sys.executable, "-c", LINK_CHECK, BRIDGE_IP, str(server.port), str(nbytes)),
        f"the link check in {ns or 'the root namespace'}",
    )
    # Each transfer ends with a one-byte answer or starts with a one-byte request: one round trip more.
    up_mbps, down_mbps = (8 * nbytes / max(t - rtt, 1e-9) / 1e6 for t in (up, down))
    return LinkFigures(rtt, up_mbps, down_mbps)


def _in_cgroup(code: str, cgroup: Path, what: str) -> float:
    p = spawn([sys.executable, "-c", code], cgroup=cgroup, stdout=subprocess.PIPE)
    stdout, _ = p.communicate(timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"{what} in {cgroup} failed (exit code {p.returncode})")
    return float(stdout)


def _cpu_stat(cgroup: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in (cgroup / "cpu.stat").read_text().splitlines())}


def check_cpu(cgroup: Path) -> CpuFigures:
    """CPU_CHECK alone in ``cgroup``, and how often the group's quota throttled it meanwhile."""
    before = _cpu_stat(cgroup)
    share = _in_cgroup(CPU_CHECK, cgroup, "the CPU check")
    after = _cpu_stat(cgroup)
    periods, throttled = (after[k] - before[k] for k in ("nr_periods", "nr_throttled"))
    return CpuFigures(share, throttled, periods)


def check_startup(cgroup: Path) -> float:
    """Seconds a worker spends on its imports in ``cgroup``."""
    return _in_cgroup(STARTUP_CHECK, cgroup, "the start-up check")


# -- the run ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Kill:
    """A fault injected by the worker itself: SIGKILL at a batch's backward pass or an evaluation batch."""

    device: str
    at: int  # the batch id (training) or the N-th evaluation batch over the process's life (1-based)
    evaluation: bool

    @classmethod
    def parse(cls, text: str, *, default_at: int, evaluation: bool) -> Kill:
        device, _, at = text.partition("@")
        return cls(device, int(at) if at else default_at, evaluation)

    @property
    def worker_args(self) -> tuple[str, str]:
        return ("--die-at-eval" if self.evaluation else "--die-at-backward", str(self.at))

    def describe(self) -> str:
        return f"SIGKILL at eval batch {self.at}" if self.evaluation else f"SIGKILL, batch {self.at} backward"


def split_sizes(n: int, classes: int, test_fraction: float) -> tuple[int, int]:
    """(train, test) sizes of ``synthetic:n:...:classes``: balanced classes, split per class as
    edgeagent.data's stratified split does."""
    sizes = [n // classes + (1 if c < n % classes else 0) for c in range(classes)]
    test = sum(min(max(round(s * test_fraction), 1), s - 1) for s in sizes)
    return n - test, test


def central_settings(*, min_cpu: float, restart_allowance: float) -> dict[str, float]:
    """The central node's deadlines for this lab (what is not given keeps its default).

    The batch timer, the evaluation deadline and the probe window follow the measured speeds (the
    central node derives them); the lab sets the start-up wait from the smallest CPU share and the
    restart window from the measured start-up time (``restart_allowance``; 0: no restarts).
    """
    slow = 1.0 / min_cpu  # what takes 1 s on a free core takes this long on the smallest quota
    return {"startup_timeout": round(60.0 * slow), "restart_window": round(restart_allowance)}


class ProgressLines:
    """A line every ``every`` seconds from the central node's metrics and the run's epoch events, read
    with the lab's observer login (which may read the cluster's topics and publish nothing)."""

    def __init__(
        self, url: BrokerUrl, cluster: str, *, every: float, total: int, epochs: int, tls: TlsOptions
    ) -> None:
        self.every, self.total, self.epochs = every, total, epochs
        self._last = 0.0
        self._epochs_done = 0
        topics = Topics(cluster)
        self.transport = MqttTransport(url, f"pi-lab-observer-{secrets.token_hex(3)}", tls=tls)
        self.transport.subscribe(topics.device(Family.METRICS, "central"), self._on_message)
        self.transport.subscribe(topics.fixed(Family.EVENTS), self._on_message)

    def _on_message(self, topic: str, payload: bytes) -> None:
        try:
            _, msg = decode(payload)
        except ProtocolError:
            return
        if isinstance(msg, Event) and msg.name == "epoch":
            self._epochs_done = max(self._epochs_done, int(msg.details.get("epoch", 0)) + 1)
        now = time.monotonic()
        if not isinstance(msg, Metrics) or now - self._last < self.every:
            return
        self._last = now
        v = msg.values
        epoch = min(self._epochs_done + 1, self.epochs)
        # The central node counts every batch it runs, the ones replayed after a rollback too.
        parts = [
            f"epoch {epoch}/{self.epochs}: {int(v.get('batches', 0))} batches run ({self.total} + replays)"
        ]
        if v.get("status") == 1:
            parts.append("recovering")
        if isinstance(v.get("loss"), int | float):
            parts.append(f"loss {v['loss']:.3f}")
        if isinstance(v.get("accuracy"), int | float):
            parts.append(f"last test acc {100 * v['accuracy']:.1f}%")
        parts.append(f"{float(v.get('samples_per_second', 0.0)):.1f} samples/s")
        parts.append(f"stages central,{','.join(v.get('workers', []))} from layers {v.get('points', [])}")
        say(", ".join(parts))

    def close(self) -> None:
        self.transport.close()


def tls_flags(tls_dir: str, device: str) -> tuple[str, ...]:
    """``--ca-file``, ``--cert-file`` and ``--key-file`` of ``device`` in the lab's site directory."""
    return tuple(
        x for key, path in tls_files(tls_dir, device).items() for x in (f"--{key.replace('_', '-')}", path)
    )


class Workers:
    """The devices' worker processes; restarts one killed mid-epoch like systemd's Restart=on-failure."""

    def __init__(
        self, devices: list[Device], url: str, cluster: str, logins: dict[str, str], tls_dir: str
    ) -> None:
        self.devices = {d.id: d for d in devices}
        self.url, self.cluster, self.logins, self.tls_dir = url, cluster, logins, tls_dir
        self.env = role_env(EDGEAGENT_LOG_LEVEL="WARNING")
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.started: list[subprocess.Popen[str]] = []
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self, device: str, fault: Kill | None = None) -> None:
        extra = (
            "--password-file",
            self.logins[device],
            *tls_flags(self.tls_dir, device),
            *(fault.worker_args if fault else ()),
        )
        cmd = worker_command(device, self.url, self.cluster, 1.0, once=True, extra=extra)
        d = self.devices[device]
        self.procs[device] = p = spawn(cmd, cgroup=d.cgroup, ns=d.link.ns, env=self.env)
        self.started.append(p)

    def watch(self, restart: str | None, delay: float) -> None:
        """Say when a worker dies; start ``restart`` again ``delay`` s after its first death."""
        pending = {restart} if restart else set()

        def loop() -> None:
            seen: set[int] = set()
            while not self._stop.wait(0.2):
                for device, p in list(self.procs.items()):
                    if p.poll() is None or p.pid in seen or p.returncode == 0:
                        continue
                    seen.add(p.pid)
                    how = "SIGKILL" if p.returncode == -signal.SIGKILL else f"exit code {p.returncode}"
                    if device not in pending:
                        say(f"{device} died ({how}); it stays down")
                        continue
                    pending.discard(device)  # once: if it dies again, it stays down
                    say(f"{device} died ({how}); systemd would restart it: starting it again in {delay:g} s")
                    if self._stop.wait(delay):
                        return
                    self.start(device)
                    say(f"{device} started again with its id")

        self._watcher = threading.Thread(target=loop, name="restarter", daemon=True)
        self._watcher.start()

    def finish(self, grace: float) -> None:
        """Stop watching; give the workers ``grace`` s to leave (they do after a run), then stop them."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()
        stop(self.started, grace)


def print_figures(report: dict[str, Any], kills: list[Kill], path: Path, restart_window: float) -> None:
    """The run's figures as a small table."""
    accuracy = report.get("test_accuracy_per_epoch", [])
    wall, train = report.get("wall_seconds", 0.0), report.get("train_seconds", 0.0)
    rows = [
        ("wall time", f"{wall:.1f} s (training {train:.1f} s)"),
        ("samples/s", f"{report.get('samples_per_second', 0):.1f}"),
        ("batches", f"{report.get('batches', 0)} in {report.get('epochs', 0)} epochs"),
        ("test accuracy", "  ".join(f"epoch {i + 1}: {100 * a:.1f}%" for i, a in enumerate(accuracy))),
        ("final accuracy", f"{100 * report.get('final_accuracy', 0):.1f}%"),
    ]
    print()
    for name, value in rows:
        print(f"{name:<16}{value}")
    recoveries = [r for r in report.get("recoveries", []) if r.get("case") != "central"]
    print(f"{'recoveries':<16}{'none' if not recoveries else ''}")
    if recoveries:
        head = f"  {'case':<6}{'batch':>6}  {'device':<8}{'injected fault':<32}"
        print(f"{head}{'detection':>11}{'recovery':>11}  rolled back to")
    for r in recoveries:
        devices = r.get("devices") or [*r.get("lost", []), *r.get("restarted", [])]
        fault = next((k.describe() for k in kills if k.device in devices), "-")
        last, detected, resumed = r.get("last_progress_at"), r.get("detected_at"), r.get("resumed_at")
        detection = f"{detected - last:.2f} s" if last is not None and detected is not None else "-"
        recovery = f"{resumed - detected:.2f} s" if detected is not None and resumed is not None else "-"
        back = f"batch {r.get('rolled_back_to', '?')} ({r.get('batches_replayed', '?')} replayed)"
        print(
            f"  {r.get('case', '?')!s:<6}{r.get('batch', '?')!s:>6}  {','.join(devices):<8}{fault:<32}"
            f"{detection:>11}{recovery:>11}  {back}"
        )
    if recoveries:
        print("  detection: last progress -> fault detected; recovery: detected -> training resumes")
    if any(r.get("case") == 3 for r in recoveries) and restart_window:
        print(
            f"  case 3 includes the {restart_window:g} s the central node waits for the device to come back"
        )
    print(f"{'report':<16}{path} (plots beside it)")


def print_checks(
    devices: list[Device],
    links: tuple[LinkFigures, LinkFigures],
    cpu: dict[str, CpuFigures],
    startup: dict[str, float],
) -> None:
    dev, root = links
    print(f"  {'link check':<36}{devices[0].id + ' (shaped)':>16}{'root namespace':>18}")
    print(f"  {'TCP round trip (median of 10)':<36}{1e3 * dev.rtt:>13.2f} ms{1e3 * root.rtt:>15.2f} ms")
    print(f"  {'upload (1 s at the nominal rate)':<36}{dev.up_mbps:>9.1f} Mbit/s{root.up_mbps:>11.0f} Mbit/s")
    print(f"  {'download':<36}{dev.down_mbps:>9.1f} Mbit/s{root.down_mbps:>11.0f} Mbit/s")
    names = [*(d.id for d in devices), "root"]
    rows = {
        "CPU check, one group at a time": names,
        "quota (share of one core)": [*(f"{100 * d.cpu:g}%" for d in devices), "none"],
        "measured: CPU-bound loop": [f"{100 * cpu[n].share:.0f}%" for n in names],
        "periods throttled by the quota": [f"{cpu[n].throttled}/{cpu[n].periods}" for n in names],
        "worker start-up (its imports)": [f"{startup[n]:.1f} s" if n in startup else "" for n in names],
    }
    for label, cells in rows.items():
        print(f"  {label:<36}" + "".join(f"{c:>10}" for c in cells))


# -- main --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the lab will run, from the arguments."""

    devices: list[Device]
    dataset: str
    train: int
    test: int
    per_epoch: int  # training batches per epoch
    evals: int  # evaluation batches per evaluation
    total: int  # training batches of the run
    kills: list[Kill]
    victim: str | None  # the device the lab restarts

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Plan:
        try:
            cpus = [float(v) / 100 for v in args.cpu.split(",")]
        except ValueError:
            cpus = []
        if not cpus or not all(0 < c <= 8 for c in cpus):
            raise SystemExit(f"--cpu {args.cpu}: give percentages of one core, e.g. 25,35,50")
        devices = make_devices(cpus)
        train, test = split_sizes(args.samples, 10, TEST_FRACTION)
        per_epoch, evals = train // BATCH, math.ceil(test / EVAL_BATCH)
        total = min(per_epoch * args.epochs, args.max_batches or per_epoch * args.epochs)
        kills = []
        if not args.no_faults and args.kill_mid_epoch != "none":
            kills.append(Kill.parse(args.kill_mid_epoch, default_at=per_epoch // 2, evaluation=False))
        if not args.no_faults and args.kill_in_eval != "none":
            kills.append(Kill.parse(args.kill_in_eval, default_at=evals + evals // 2, evaluation=True))
        ids = [d.id for d in devices]
        for k in kills:
            if k.device not in ids:
                raise SystemExit(f"{k.device} is not a device of this lab; they are {', '.join(ids)}")
        if len({k.device for k in kills}) < len(kills):
            raise SystemExit("kill two different devices (a restarted worker no longer carries its fault)")
        mid_epoch = next((k for k in kills if not k.evaluation), None)
        victim = mid_epoch.device if mid_epoch and args.restart else None
        dataset = f"synthetic:{args.samples}:3x32x32:10"
        return cls(devices, dataset, train, test, per_epoch, evals, total, kills, victim)

    def where(self, kill: Kill) -> str:
        """Which epoch or evaluation a kill falls in (batch ids count from 0, evaluation batches from 1)."""
        if kill.evaluation:
            run, at = divmod(kill.at - 1, self.evals)
            return f"evaluation {run + 1}, its batch {at + 1} of {self.evals}"
        epoch, at = divmod(kill.at, self.per_epoch)
        return f"epoch {epoch + 1}, its batch {at + 1} of {self.per_epoch}"


def run_checks(plan: Plan, args: argparse.Namespace) -> float:
    """Print what the links and the quotas really give; return the restarted worker's start-up time."""
    say("checking the links and the CPU quotas ...")
    server = EchoServer(BRIDGE_IP)
    try:
        nbytes = int(args.mbps * 1e6 / 8)  # one second at the nominal rate
        links = (check_link(plan.devices[0].link.ns, server, nbytes), check_link(None, server, nbytes))
    finally:
        server.close()
    # One group at a time: together they would compete with each other (and the machine's other work).
    groups = {**{d.id: d.cgroup for d in plan.devices}, "root": LAB_CGROUP / "central"}
    cpu = {name: check_cpu(group) for name, group in groups.items()}
    slow = plan.victim or min(plan.devices, key=lambda d: d.cpu).id
    startup = {name: check_startup(groups[name]) for name in (slow, "root")}
    print_checks(plan.devices, links, cpu, startup)
    return startup[slow]


def run_training(
    plan: Plan, args: argparse.Namespace, startup: float, tmp: Path, stack: contextlib.ExitStack
) -> int:
    """Logins, broker, central node, workers; wait for the run; print its figures.

    ``startup``: how long the worker the lab restarts took to start in its cgroup, idle (run_checks).
    """
    # Deadlines: a killed worker's window to come back covers the restart delay and its start-up under its
    # quota on a machine that is also training (twice the idle figure measured above, plus 10 s).
    allowance = args.restart_delay + 2 * startup + 10 if plan.victim else 0.0
    settings = central_settings(min_cpu=min(d.cpu for d in plan.devices), restart_allowance=allowance)
    config = tmp / "central.yaml"
    config.write_text("".join(f"{k}: {v}\n" for k, v in settings.items()))
    say(f"central node deadlines: {', '.join(f'{k} {v} s' for k, v in settings.items())}")

    ids = [d.id for d in plan.devices]
    cluster = f"pilab-{secrets.token_hex(3)}"
    credentials, passwords = tmp / "credentials", tmp / "passwords"
    passwords.mkdir(mode=0o700)
    logins = throwaway_logins(str(credentials), cluster, ["central", *ids], str(passwords))
    observer = CredentialStore(str(credentials)).add("lab-observer", role="observer", cluster=cluster)
    # TLS with client certificates, as a deployment on a LAN (docs/deployment.md): the broker listens on
    # the lab's bridge, beyond loopback, where plain TCP is refused.
    site = init_site(tmp / "tls", [BRIDGE_IP], ["central", *ids, "lab-observer"])
    tls_dir = str(site.directory)
    port = free_port(BRIDGE_IP)
    url = f"mqtts://{BRIDGE_IP}:{port}"
    group = LAB_CGROUP / "central"
    edgeagent = [sys.executable, "-m", "edgeagent"]
    broker_cmd = [
        "broker", "--host", BRIDGE_IP, "--port", str(port), "--credentials-dir", str(credentials),
        "--cert-file", str(site.broker.cert), "--key-file", str(site.broker.key),
        "--ca-file", str(site.ca.cert), "--require-client-cert",
    ]  # fmt: skip
    broker = spawn([*edgeagent, *broker_cmd, "--log-level", "WARNING"], cgroup=group, env=role_env())
    stack.callback(stop, [broker])
    wait_for_port(BRIDGE_IP, port, broker, timeout=120)
    say(
        f"broker on {url} (TLS, client certificates): logins for central, {', '.join(ids)} and the lab's "
        f"observer (cluster {cluster})"
    )

    central_cmd = [
        "central", "--config", str(config), "--workers", str(len(ids)), "--model", args.model,
        "--dataset", plan.dataset, "--epochs", str(args.epochs), "--report", str(args.report),
        "--broker", url, "--password-file", logins["central"], "--cluster", cluster,
        "--checkpoint", str(tmp / "checkpoints"),  # the lab's own, removed with it
        *tls_flags(tls_dir, "central"),
        *(["--max-batches", str(args.max_batches)] if args.max_batches else []),
    ]  # fmt: skip
    say(
        f"run: {args.model} on {plan.dataset} ({plan.train} train / {plan.test} test images), "
        f"{args.epochs} epochs of {plan.per_epoch} batches of {BATCH}; stages on central, {', '.join(ids)}"
    )
    for k in plan.kills:
        then = (
            f"restarted after {args.restart_delay:g} s: case 2"
            if k.device == plan.victim
            else "left dead: case 3"
        )
        say(f"fault: {k.device} {k.describe()} ({plan.where(k)}); {then}")
    say("$ edgeagent " + shlex.join(central_cmd))
    workers = Workers(plan.devices, url, cluster, logins, tls_dir)
    stack.callback(workers.finish, 5.0)
    # Stopped before the workers (last in, first out): no fault handling of workers that leave.
    central = spawn([*edgeagent, *central_cmd], cgroup=group, env=role_env())
    stack.callback(stop, [central])
    for d in plan.devices:
        workers.start(d.id, next((k for k in plan.kills if k.device == d.id), None))
    workers.watch(plan.victim, args.restart_delay)
    login = dataclasses.replace(BrokerUrl.parse(url), username="lab-observer", password=observer)
    observer_tls = TlsOptions(**tls_files(tls_dir, "lab-observer"))
    progress = ProgressLines(
        login, cluster, every=args.progress_every, total=plan.total, epochs=args.epochs, tls=observer_tls
    )
    stack.callback(progress.close)

    try:
        rc = central.wait(timeout=60 * args.time_limit)
    except subprocess.TimeoutExpired:
        say(f"the run did not finish within {args.time_limit:g} min; stopping it")
        return 1
    workers.finish(grace=30)  # they leave by themselves after the run
    if rc != 0 or not args.report.is_file():
        say(f"the central node ended with exit code {rc}; no figures")
        return 1
    print_figures(
        json.loads(args.report.read_text()), plan.kills, args.report, settings.get("restart_window", 0.0)
    )
    return 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", default="25,35,50", help="CPU quota per device, %% of one core (25,35,50)")
    p.add_argument(
        "--central-cpu", type=float, default=0.0, help="%% of one core for central+broker (0: none)"
    )
    p.add_argument("--mbps", type=float, default=20.0, help="link rate each way in Mbit/s (20)")
    p.add_argument("--delay-ms", type=float, default=5.0, help="delay each way, where sch_netem exists (5)")
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--samples", type=int, default=10_000, help="N of synthetic:N:3x32x32:10 (10000)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-batches", type=int, help="stop after this many batches (quick tries)")
    p.add_argument(
        "--kill-mid-epoch",
        default="pi-1",
        help="DEVICE[@BATCH]: SIGKILL when BATCH starts its backward pass (pi-1, mid epoch 1); none: off",
    )
    p.add_argument(
        "--kill-in-eval",
        default="pi-2",
        help="DEVICE[@N]: SIGKILL at its N-th evaluation batch (pi-2, mid evaluation 2); none: off",
    )
    p.add_argument("--no-faults", action="store_true", help="neither kill")
    p.add_argument(
        "--restart",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start the worker killed mid-epoch again, as systemd's Restart=on-failure would (on)",
    )
    p.add_argument("--restart-delay", type=float, default=5.0, help="seconds before it (RestartSec=5)")
    p.add_argument(
        "--report", type=Path, default=Path("report-pi-lab.json"), help="JSON report (plots beside)"
    )
    p.add_argument("--progress-every", type=float, default=15.0, help="seconds between progress lines")
    p.add_argument("--time-limit", type=float, default=120.0, help="minutes before the lab gives up (120)")
    args = p.parse_args()
    args.report = args.report.resolve()
    args.report.parent.mkdir(parents=True, exist_ok=True)
    return args


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> int:
    args = parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the Pi lab creates namespaces and cgroups: run it as root (sudo make pi-lab)")
    problem = cgroup_problem()
    if problem is not None:
        raise SystemExit(f"the quotas need {problem}")
    plan = Plan.from_args(args)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    started = time.monotonic()
    with exclusive(), contextlib.ExitStack() as stack:
        leftovers = remove_lab(plan.devices)
        if leftovers:
            say(f"removed what an earlier run left: {', '.join(leftovers)}")
        stack.callback(say, "lab removed: processes, namespaces, interfaces, cgroups")
        stack.callback(remove_lab, plan.devices)
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pi-lab-")))
        try:
            delayed = build_lab(
                plan.devices,
                mbps=args.mbps,
                delay_ms=args.delay_ms,
                central_cpu=args.central_cpu / 100 or None,
            )
            delay = f" + {args.delay_ms:g} ms" if args.delay_ms and delayed else ""
            devices = ", ".join(f"{d.id} ({d.link.ns_ip}, {100 * d.cpu:g}% CPU)" for d in plan.devices)
            say(
                f"lab up: {devices}; links {args.mbps:g} Mbit/s{delay} each way; "
                f"broker and central node on {BRIDGE_IP}"
            )
            if args.delay_ms and not delayed:
                say(f"no sch_netem in this kernel: rate limits only, without the {args.delay_ms:g} ms delay")
            startup = run_checks(plan, args)
            rc = run_training(plan, args, startup, tmp, stack)
        except KeyboardInterrupt:
            say("interrupted; cleaning up")
            rc = 130
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            say(f"the lab failed: {exc}; cleaning up")
            rc = 1
        finally:
            # The clean-up (the stack, last in first out) must not be cut short by a second Ctrl-C.
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
        say(f"lab time {time.monotonic() - started:.0f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
