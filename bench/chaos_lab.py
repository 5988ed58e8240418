"""The chaos benchmark's cluster (``bench/chaos.py``): real processes, started as the shipped units do.

* **Network.** As root each worker runs in its own network namespace behind a veth pair on a bridge (the
  helpers of ``bench/netlab.py``, as the Pi lab has it); the broker listens on the bridge, the central
  node reaches it from the root namespace. A dropped link is the host end of a worker's pair set down
  (this kernel may lack ``sch_netem``, so not ``netem loss 100%``; a link down drops every packet both
  ways as well, and TCP retransmits once it is up again). Without root everything is on loopback and the
  dropped link cannot be made.
* **Broker.** ``edgeagent broker`` as its own process on a free port, over TLS with client certificates and
  per-device logins (it listens beyond loopback), restartable on the same port.
* **Central node and workers.** Each is its unit's exact ``ExecStart`` (``systemd/edgeagent-central.service``,
  ``systemd/edgeagent-worker.service``; read by :mod:`edgeagent.ops.units`): the installed program, the
  ``/etc/edgeagent`` configuration and ``${STATE_DIRECTORY}``/``${CREDENTIALS_DIRECTORY}`` replaced by
  this machine's, the files of ``LoadCredential=`` copied where systemd would put them, ``Environment=``
  applied, ``WorkingDirectory=`` the state directory. The configurations are ``configs/central.yaml`` and
  ``configs/worker.yaml`` with the bench's broker, cluster and workload (:func:`central_yaml`).
* **Restarts.** :class:`Service` is what systemd does for a unit: it restarts the process after
  ``RestartSec=`` when it fails (``Restart=on-failure``), and as a fault asks: a SIGTERM is ``systemctl
  restart`` (started again once it exited), a SIGKILL of the central node the unit's own ``Restart=``, a
  SIGKILLed worker comes back with its id after the fault's seeded delay.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import yaml

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
)
from edgeagent.broker.certs import Site as TlsSite
from edgeagent.broker.certs import init_site
from edgeagent.broker.credentials import CredentialStore
from edgeagent.cli.demo import throwaway_logins
from edgeagent.ops.units import ServiceUnit
from edgeagent.pipeline.audit import AUDIT_ENV

REPO = Path(__file__).resolve().parents[1]
CENTRAL_UNIT = ServiceUnit.read(REPO / "systemd" / "edgeagent-central.service")
WORKER_UNIT = ServiceUnit.read(REPO / "systemd" / "edgeagent-worker.service")
CENTRAL_YAML, WORKER_YAML = REPO / "configs" / "central.yaml", REPO / "configs" / "worker.yaml"
PROGRAM = Path(sys.executable).with_name("edgeagent")  # this venv's, in place of /opt/edgeagent/venv
PREFIX = "eacx"  # every namespace and interface of the bench starts with this
SUBNET = "10.214.0"
BRIDGE, BRIDGE_IP = f"{PREFIX}-br", f"{SUBNET}.1"
FORGER, OBSERVER = "mallory", "chaos-observer"  # a device login that forges; the bench's read-only eyes

_t0 = time.monotonic()


def say(text: str) -> None:
    """The bench's own lines: minutes:seconds since it started, then what happens."""
    elapsed = int(time.monotonic() - _t0)
    print(f"[chaos {elapsed // 60:02d}:{elapsed % 60:02d}] {text}", flush=True)


# -- the network ------------------------------------------------------------------------------------


class Network:
    """Every worker in its own namespace on one bridge (root), or all on loopback (see the module doc)."""

    def __init__(self, workers: list[str], *, isolated: bool) -> None:
        self.isolated = isolated
        self.links = {
            w: NetnsLink(
                f"{PREFIX}-{i}", f"{PREFIX}{i}h", f"{PREFIX}{i}n", f"{SUBNET}.{10 + i}/24", bridge=BRIDGE
            )
            for i, w in enumerate(workers, start=1)
        }
        self.host = BRIDGE_IP if isolated else "127.0.0.1"

    def up(self) -> None:
        if not self.isolated:
            return
        self.down()  # what a crashed run left behind
        add_bridge(BRIDGE, f"{BRIDGE_IP}/24")
        for link in self.links.values():
            add_link(link)

    def down(self) -> None:
        if not self.isolated:
            return
        for link in self.links.values():
            remove_link(link)
        for ns in netns_names():
            if ns.startswith(f"{PREFIX}-"):
                sh("ip", "netns", "del", ns, check=False)
        remove_bridge(BRIDGE)

    def netns(self, device: str) -> str | None:
        return self.links[device].ns if self.isolated and device in self.links else None

    def set_link(self, device: str, *, up: bool) -> None:
        """The worker's link to the bridge up or down (its host end: nothing gets through either way)."""
        sh("ip", "link", "set", self.links[device].host_if, "up" if up else "down")


# -- logins, certificates, the broker ---------------------------------------------------------------


class Site:
    """Throw-away logins (central, workers, the forger: a device login; the observer) and a site's TLS
    certificates naming the broker's address."""

    def __init__(self, folder: Path, cluster: str, workers: list[str], host: str) -> None:
        self.credentials = folder / "credentials"
        passwords = folder / "passwords"
        passwords.mkdir(mode=0o700, parents=True)
        self.passwords = throwaway_logins(
            str(self.credentials), cluster, ["central", *workers, FORGER], str(passwords)
        )
        self.observer_password = CredentialStore(str(self.credentials)).add(
            OBSERVER, role="observer", cluster=cluster
        )
        self.tls: TlsSite = init_site(folder / "tls", [host], ["central", *workers, FORGER, OBSERVER])

    def password(self, device: str) -> str:
        return Path(self.passwords[device]).read_text().strip()

    def files(self, device: str) -> tuple[str, str, str]:
        """(CA, certificate, key) of ``device``."""
        pair = self.tls.devices[device]
        return str(self.tls.ca.cert), str(pair.cert), str(pair.key)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Broker:
    """``edgeagent broker`` as its own process on ``host:port``; :meth:`stop` and :meth:`start` again on
    the same port are a broker restart."""

    def __init__(self, site: Site, host: str, log: Path) -> None:
        self.site, self.host, self.port = site, host, free_port(host)
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtts://{self.host}:{self.port}"

    def start(self) -> None:
        tls = self.site.tls
        argv = [
            str(PROGRAM), "broker", "--host", self.host, "--port", str(self.port),
            "--credentials-dir", str(self.site.credentials), "--cert-file", str(tls.broker.cert),
            "--key-file", str(tls.broker.key), "--ca-file", str(tls.ca.cert), "--require-client-cert",
            "--log-level", "WARNING",
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_listening(60.0)

    def _wait_listening(self, timeout: float) -> None:
        """Until the port accepts a connection: the broker has no other sign that it is up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"the broker exited ({self.proc.returncode}); see {self.log}")
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=1):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the broker did not listen on {self.host}:{self.port} in {timeout:g} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


# -- units as processes -------------------------------------------------------------------------------


@dataclass
class Life:
    """One process of a unit: when it ran, how it ended and why (the fault that ended it, or none)."""

    pid: int
    started: float
    ended: float | None = None
    code: int | None = None
    cause: str = ""


@dataclass
class Planned:
    """A fault's plan for the next exit: restart after ``delay`` s (None: stay down)."""

    cause: str
    delay: float | None


@dataclass
class Service:
    """A unit's process, supervised as systemd would (see the module doc)."""

    name: str
    unit: ServiceUnit
    argv: list[str]
    cwd: Path
    env: dict[str, str]
    log: Path
    notify: Callable[[str], None] = say
    lives: list[Life] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)  # exits no fault asked for
    finished: threading.Event = field(default_factory=threading.Event)  # exit 0 that nobody asked for
    _proc: subprocess.Popen[bytes] | None = None
    _planned: Planned | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _out: IO[bytes] | None = None
    _started: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            self._out = self.log.open("ab")
            self._out.write(f"=== {self.name} started at t={time.monotonic():.3f}\n".encode())
            self._out.flush()
            # A session of its own: the terminal's Ctrl-C and signals reach it only as the bench sends them.
            proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdout=self._out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            self._proc = proc
            self.lives.append(Life(proc.pid, time.monotonic()))
        with self._started:
            self._started.notify_all()
        threading.Thread(target=self._watch, args=(proc,), name=f"watch-{self.name}", daemon=True).start()

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def running(self) -> bool:
        return self.pid is not None

    def wait_running(self, timeout: float) -> bool:
        """Until a process of the unit runs (a restart after a fault may be pending); False after
        ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._started:
            while not self.running():
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping.is_set():
                    return False
                self._started.wait(min(left, 1.0))
        return True

    def plan_exit(self, cause: str, restart_after: float | None) -> None:
        """The next exit is a fault's (``cause``): restart after ``restart_after`` s, or stay down."""
        with self._lock:
            self._planned = Planned(cause, restart_after)

    def signal(self, sig: signal.Signals) -> int | None:
        """Send ``sig`` to the running process; its pid, or None if none runs."""
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pid

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        with self._lock:
            life = next(life for life in self.lives if life.pid == proc.pid)
            life.ended, life.code = time.monotonic(), code
            planned, self._planned = self._planned, None
        if self._stopping.is_set():
            return
        if planned is not None:
            life.cause = planned.cause
            delay = planned.delay
        elif code != 0:
            # Restart=on-failure: a crash nobody asked for is a finding; systemd starts it again.
            life.cause = f"unexpected exit {code}"
            self.unexpected.append(f"{self.name} pid {proc.pid}: exit code {code} (see {self.log})")
            self.notify(
                f"{self.name} exited with {code} unasked; Restart=on-failure in {self.unit.restart_sec:g} s"
            )
            delay = self.unit.restart_sec
        else:
            self.finished.set()
            return
        if delay is None or self._stopping.wait(delay):
            return
        self.start()

    def stop(self, grace: float = 15.0) -> None:
        """Stop supervising; SIGTERM (SIGCONT first, if it was stopped), SIGKILL after ``grace`` s."""
        self._stopping.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._out is not None:
            self._out.close()


# -- configuration ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """What the run trains and how fast the emulated devices are (the same in both arms)."""

    seed: int
    epochs: int
    workers: int
    slowdown: float  # every device's, the central node's too: an even split, stages of equal speed
    global_every: int
    chain_every: int
    batch_timeout: float  # the batch timer's floor (the shipped central.yaml: 30 s)
    restart_window: float  # how long a missing device may take to come back (central.yaml: 30 s)

    @property
    def worker_ids(self) -> list[str]:
        return [f"worker-{i}" for i in range(1, self.workers + 1)]


def central_yaml(path: Path, work: Workload, *, url: str, cluster: str) -> Path:
    """``configs/central.yaml`` pointed at the bench's broker and cluster, training the default MLP on digits
    (the shipped MobileNetV2 would take hours here) with a cosine rate that ends at 0 (a plateau: the final
    accuracy is a stable figure to compare), replication points close enough that a restart replays little."""
    data = yaml.safe_load(CENTRAL_YAML.read_text())
    data.update(
        broker=url, cluster=cluster, workers=work.workers, threads=1, slowdown=work.slowdown,
        global_every=work.global_every, chain_every=work.chain_every, batch_timeout=work.batch_timeout,
        restart_window=work.restart_window,
    )  # fmt: skip
    data["train"].update(
        model="mlp", model_options={}, epochs=work.epochs, lr_schedule="cosine", seed=work.seed
    )
    path.write_text(yaml.safe_dump(data))
    return path


def worker_yaml(path: Path, work: Workload, *, url: str, cluster: str, device: str) -> Path:
    """``configs/worker.yaml`` for ``device``: the bench's broker, its slowdown, one torch thread, and
    ``nan_on_usr1: gradient`` (the NaN fault: a SIGUSR1 poisons the next gradient it sends)."""
    data = yaml.safe_load(WORKER_YAML.read_text())
    data.update(
        broker=url,
        cluster=cluster,
        device_id=device,
        threads=1,
        slowdown=work.slowdown,
        nan_on_usr1="gradient",
    )
    path.write_text(yaml.safe_dump(data))
    return path


def install_credentials(unit: ServiceUnit, folder: Path, sources: dict[str, str]) -> None:
    """What ``LoadCredential=NAME:PATH`` does: a private copy of each file as ``folder/NAME``. ``sources``
    maps the unit's installed paths to this machine's files; a path it does not know is an error."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in unit.credentials():
        if source not in sources:
            raise RuntimeError(f"{unit.path}: LoadCredential={name}:{source}, which the bench cannot provide")
        shutil.copyfile(sources[source], folder / name)
        (folder / name).chmod(0o400)


def service_env(unit: ServiceUnit, state: Path, credentials: Path, audit: Path) -> dict[str, str]:
    """The environment systemd gives the unit (its ``Environment=``, the state and credentials
    directories), the audit log's directory (as an ``Environment=`` line would), nothing of systemd's own."""
    skip = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "STATE_DIRECTORY", "CREDENTIALS_DIRECTORY")
    env = {k: v for k, v in os.environ.items() if k not in skip}
    env.update(unit.environment())
    env.update(STATE_DIRECTORY=str(state), CREDENTIALS_DIRECTORY=str(credentials), COLUMNS="200")
    env[AUDIT_ENV] = str(audit)
    return env


def central_service(
    folder: Path, site: Site, work: Workload, *, url: str, cluster: str, audit: Path
) -> Service:
    state, creds = folder / "central" / "state", folder / "central" / "credentials"
    state.mkdir(parents=True)
    ca, cert, key = site.files("central")
    install_credentials(
        CENTRAL_UNIT,
        creds,
        {
            "/etc/edgeagent/central-password": site.passwords["central"],
            "/etc/edgeagent/tls/ca.pem": ca,
            "/etc/edgeagent/tls/central.pem": cert,
            "/etc/edgeagent/tls/central.key": key,
        },
    )
    config = central_yaml(folder / "central" / "central.yaml", work, url=url, cluster=cluster)
    argv = CENTRAL_UNIT.command(
        program=PROGRAM, state=state, credentials=creds, files={"/etc/edgeagent/central.yaml": config}
    )
    return Service(
        "central",
        CENTRAL_UNIT,
        argv,
        CENTRAL_UNIT.working_directory(state),
        service_env(CENTRAL_UNIT, state, creds, audit),
        folder / "logs" / "central.log",
    )


def worker_service(
    folder: Path,
    site: Site,
    work: Workload,
    device: str,
    *,
    url: str,
    cluster: str,
    audit: Path,
    netns: str | None,
) -> Service:
    base = folder / device
    state, creds = base / "state", base / "credentials"
    state.mkdir(parents=True)
    ca, cert, key = site.files(device)
    install_credentials(
        WORKER_UNIT,
        creds,
        {
            "/etc/edgeagent/broker-password": site.passwords[device],
            "/etc/edgeagent/tls/ca.pem": ca,
            "/etc/edgeagent/tls/device.pem": cert,
            "/etc/edgeagent/tls/device.key": key,
        },
    )
    config = worker_yaml(base / "worker.yaml", work, url=url, cluster=cluster, device=device)
    argv = WORKER_UNIT.command(
        program=PROGRAM, state=state, credentials=creds, files={"/etc/edgeagent/worker.yaml": config}
    )
    return Service(
        device,
        WORKER_UNIT,
        in_netns(netns, *argv),  # `ip netns exec` execs the command: the pid is the worker's
        WORKER_UNIT.working_directory(state),
        service_env(WORKER_UNIT, state, creds, audit),
        folder / "logs" / f"{device}.log",
    )


def shipped_central() -> dict[str, float]:
    """The shipped central.yaml's floors the bench keeps unless told otherwise."""
    data = yaml.safe_load(CENTRAL_YAML.read_text())
    return {k: float(data[k]) for k in ("batch_timeout", "restart_window")}


__all__ = [
    "BRIDGE_IP",
    "FORGER",
    "OBSERVER",
    "Broker",
    "Network",
    "Service",
    "Site",
    "Workload",
    "central_service",
    "say",
    "shipped_central",
    "worker_service",
]
