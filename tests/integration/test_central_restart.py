"""The central node survives its own restart (issue 49, defect 1 of "Why", and the disk of item 6).

Real processes throughout: the central node is started with the exact ``ExecStart`` of
``systemd/edgeagent-central.service`` (its config path, ``$STATE_DIRECTORY``, ``WorkingDirectory`` and the
installed ``edgeagent`` replaced by this test's), on a configuration derived from
``configs/central.yaml``; workers run as ``edgeagent worker`` serves (not ``--once``), as their unit does.
Faults are real SIGKILLs and SIGTERMs, sent when the central node announces a checkpoint on
``run/events``; every wait is for something the cluster says on the broker.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from edgeagent.broker import BrokerTls, EmbeddedBroker
from edgeagent.broker.certs import Site, init_site
from edgeagent.cli.demo import LocalWorkers, WorkerProcess, worker_command
from edgeagent.errors import ProtocolError
from edgeagent.ops.units import ServiceUnit
from edgeagent.protocol.messages import Announce, Event, Message, Status
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode
from edgeagent.transport.mqtt import MqttTransport, TlsOptions

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "edgeagent-central.service"
CENTRAL_YAML = REPO / "configs" / "central.yaml"
WORKER_UNIT = REPO / "systemd" / "edgeagent-worker.service"
WORKER_YAML = REPO / "configs" / "worker.yaml"
PER_EPOCH = 44  # digits: 1437 training samples, whole batches of 32


# -- the unit, as systemd would run it ------------------------------------------------------------


def unit_settings() -> dict[str, str]:
    """The ``[Service]`` keys of the central node's unit (the last value of each); a line ending in a
    backslash goes on on the next, as systemd reads it."""
    return ServiceUnit.read(UNIT).settings


def unit_command(state: Path, config: Path) -> tuple[list[str], Path]:
    """The unit's exact ``ExecStart`` and working directory for this machine: its config, state
    directory and installed program replaced by the test's."""
    unit = ServiceUnit.read(UNIT)
    program = Path(sys.executable).with_name("edgeagent")  # this venv's installed edgeagent
    argv = unit.command(
        program=program,
        state=state,
        credentials=state / "credentials",
        files={"/etc/edgeagent/central.yaml": config},
    )
    return argv, unit.working_directory(state)


def unit_config(folder: Path, broker: str, cluster: str, **top: Any) -> Path:
    """``configs/central.yaml`` pointed at the test broker without credentials, on the default MLP (the
    shipped MobileNetV2 is minutes per epoch on this machine), one torch thread, a global replication
    point every 20 batches (within the first epoch of 44)."""
    data = yaml.safe_load(CENTRAL_YAML.read_text())
    data.pop("password_file")
    data.update(broker=broker, cluster=cluster, threads=1, global_every=20, chain_every=10, **top)
    data["train"].update(model="mlp", model_options={}, epochs=3)
    path = folder / "central.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def service_env(state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    return {
        **env,
        "STATE_DIRECTORY": str(state),
        "CREDENTIALS_DIRECTORY": str(state / "credentials"),
        "PYTHONUNBUFFERED": "1",
    }


def unit_credentials(state: Path, site: Site) -> None:
    """What ``LoadCredential=`` hands the unit: the site CA and the central node's client certificate."""
    folder = state / "credentials"
    folder.mkdir(parents=True)
    central = site.devices["central"]
    for name, source in (("ca.pem", site.ca.cert), ("client.pem", central.cert), ("client.key", central.key)):
        shutil.copyfile(source, folder / name)


def tls_flags(site: Site, device: str) -> tuple[str, ...]:
    pair = site.devices[device]
    return ("--ca-file", str(site.ca.cert), "--cert-file", str(pair.cert), "--key-file", str(pair.key))


@dataclass(frozen=True)
class TlsBroker:
    url: str
    site: Site


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[TlsBroker]:
    """The embedded broker over TLS with client certificates, as the shipped units run it (mqtts://)."""
    site = init_site(
        tmp_path / "tls", ["localhost", "127.0.0.1"], ["central", "worker-1", "worker-2", "watch"]
    )
    tls = BrokerTls(str(site.broker.cert), str(site.broker.key), str(site.ca.cert), require_client_cert=True)
    broker = EmbeddedBroker(tls=tls).start()
    try:
        yield TlsBroker(broker.url.replace("mqtt://", "mqtts://").replace("127.0.0.1", "localhost"), site)
    finally:
        broker.stop()


class Central:
    """``edgeagent central`` as a process, its output in a file."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = log.open("ab")
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self._out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout:g} s:\n{self.output()[-3000:]}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._out.close()


class Wire:
    """What the cluster says on ``run/events``, every device's status and ``announce``, decoded, as it
    arrives: the tests wait for these, never for time."""

    def __init__(self, broker: str, cluster: str, site: Site | None = None) -> None:
        self.topics = Topics(cluster)
        self.seen: list[tuple[float, str, Message]] = []
        self.changed = threading.Condition()
        tls = None
        if site is not None:
            pair = site.devices["watch"]
            tls = TlsOptions(str(site.ca.cert), str(pair.cert), str(pair.key))
        self.transport = MqttTransport(broker, f"watch-{cluster}-{uuid.uuid4().hex[:6]}", tls=tls)
        for pattern in (
            self.topics.fixed(Family.EVENTS),
            self.topics.devices(Family.ANNOUNCE),
            self.topics.devices(Family.STATUS),
        ):
            self.transport.subscribe(pattern, self._on)
        assert self.transport.wait_connected(10)

    def _on(self, topic: str, payload: bytes) -> None:
        try:
            sender, msg = decode(payload)
        except ProtocolError:
            return
        with self.changed:
            self.seen.append((time.monotonic(), sender, msg))
            self.changed.notify_all()

    def wait(
        self,
        what: str,
        match: Callable[[str, Message], bool],
        *,
        timeout: float,
        after: float = 0.0,
        central: Central | None = None,
    ) -> tuple[float, Message]:
        """The first message since ``after`` that ``match``es (sender, message), with when it came; fails
        after ``timeout`` s, or as soon as ``central`` exits first."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for t, sender, msg in self.seen:
                    if t >= after and match(sender, msg):
                        return t, msg
                if central is not None and central.proc.poll() is not None:
                    raise AssertionError(
                        f"no {what}: the central node exited ({central.proc.returncode}) first:\n"
                        f"{central.output()[-3000:]}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    tail = central.output()[-3000:] if central is not None else ""
                    raise AssertionError(f"no {what} in {timeout:g} s\n{tail}")
                self.changed.wait(min(left, 0.5))

    def events(self, name: str) -> list[Event]:
        with self.changed:
            return [m for _, _, m in self.seen if isinstance(m, Event) and m.name == name]

    def close(self) -> None:
        self.transport.close()


def event(name: str, **details: Any) -> Callable[[str, Message], bool]:
    def match(_sender: str, msg: Message) -> bool:
        return (
            isinstance(msg, Event)
            and msg.name == name
            and all(msg.details.get(k) == v for k, v in details.items())
        )

    return match


def status_of(device: str, state: str) -> Callable[[str, Message], bool]:
    def match(sender: str, msg: Message) -> bool:
        return isinstance(msg, Status) and sender == device and msg.state == state

    return match


def idle_announce_of(device: str) -> Callable[[str, Message], bool]:
    def match(sender: str, msg: Message) -> bool:
        return isinstance(msg, Announce) and sender == device and msg.busy_with == ""

    return match


def checkpoint_at_least(version: int) -> Callable[[str, Message], bool]:
    def match(_sender: str, msg: Message) -> bool:
        return (
            isinstance(msg, Event) and msg.name == "checkpoint" and msg.details.get("version", -1) >= version
        )

    return match


def start_workers(url: str, cluster: str, site: Site | None = None) -> list[WorkerProcess]:
    """worker-1 and worker-2 serving runs until stopped, as their unit runs them (no ``--once``); started
    as the tests start every worker (LocalWorkers.spawn: forks of a process that imported torch once)."""
    return [
        LocalWorkers.spawn(
            worker_command(
                f"worker-{i}",
                url,
                cluster,
                1.0,
                once=False,
                extra=tls_flags(site, f"worker-{i}") if site else (),
            ),
            dict(os.environ),
        )
        for i in (1, 2)
    ]


@pytest.fixture
def workers(amqtt_url: str, cluster: str) -> Iterator[list[WorkerProcess]]:
    procs = start_workers(amqtt_url, cluster)
    yield from _stopped_after(procs)


@pytest.fixture
def tls_workers(tls_broker: TlsBroker, cluster: str) -> Iterator[list[WorkerProcess]]:
    procs = start_workers(tls_broker.url, cluster, tls_broker.site)
    yield from _stopped_after(procs)


def _stopped_after(procs: list[WorkerProcess]) -> Iterator[list[WorkerProcess]]:
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def checkpoints_under(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*.ckpt"))}


# -- the unit's ExecStart killed and started again -----------------------------------------------


def _killed_and_rerun(
    broker: TlsBroker, cluster: str, tmp_path: Path, sig: signal.Signals
) -> tuple[Wire, dict[str, Any], str, Event]:
    """Start the unit's command (over TLS with its credentials, as the unit has it), send ``sig`` once its
    checkpoint of version 40 (mid-epoch 0) is announced, check how it ended, run the same command again:
    (wire, report, run id, the checkpoint event)."""
    state = tmp_path / "state"
    state.mkdir()
    unit_credentials(state, broker.site)
    argv, cwd = unit_command(state, unit_config(tmp_path, broker.url, cluster))
    assert cwd == state  # WorkingDirectory: the report lands in the state directory
    wire = Wire(broker.url, cluster, broker.site)
    first = Central(argv, cwd, service_env(state), tmp_path / "first.log")
    try:
        _, ckpt = wire.wait("checkpoint of version 40", checkpoint_at_least(40), timeout=240, central=first)
        assert isinstance(ckpt, Event)
        signalled = time.monotonic()
        first.proc.send_signal(sig)
        code = first.wait(timeout=60)
        stopped_in = time.monotonic() - signalled
    finally:
        first.stop()
    run_id = ckpt.run_id
    # On disk: the announced checkpoint, or newer ones (the run may pass more replication points, every 20
    # batches, before the signal lands on a loaded machine, and keeps only the newest three).
    on_disk = sorted(int(f.stem[1:]) for f in (state / "checkpoints" / cluster / run_id).glob("v*.ckpt"))
    assert on_disk and on_disk[-1] >= ckpt.details["version"] >= 40, on_disk
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
    else:
        assert code == 0, f"exit {code} after SIGTERM:\n{first.output()[-3000:]}"
        assert stopped_in < 30, f"SIGTERM took {stopped_in:.1f} s"
        _, suspended = wire.wait("the run suspended", event("run-suspended"), timeout=10)
        assert isinstance(suspended, Event)
        assert Path(suspended.details["checkpoint"]).is_file()  # on disk before the process ended
    second = Central(argv, cwd, service_env(state), tmp_path / "second.log")
    try:
        assert second.wait(timeout=300) == 0, second.output()[-3000:]
    finally:
        second.stop()
    report = json.loads((state / "report.json").read_text())
    return wire, report, run_id, ckpt


def test_the_units_command_sigkilled_mid_epoch_resumes_its_run(
    tls_broker: TlsBroker, cluster: str, tmp_path: Path, tls_workers: list[WorkerProcess]
) -> None:
    """The unit restarted `edgeagent central` without --resume: a new run, "only 0 of 2 workers", and at
    the next restart a new run overwrote the old one's checkpoint. Now the same command resumes the run,
    and the workers still in it rejoin."""
    wire, report, run_id, _ = _killed_and_rerun(tls_broker, cluster, tmp_path, signal.SIGKILL)
    try:
        assert report["run_id"] == run_id
        (resumed,) = [r for r in report["recoveries"] if r.get("case") == "central"]
        # The newest checkpoint before the kill (40, or a later replication point if the signal came later).
        assert resumed["resumed_from"] >= 40 and resumed["resumed_from"] % 20 == 0
        assert report["timeline"][0]["batch"] == resumed["resumed_from"]  # nothing before it is redone
        (announced,) = wire.events("run-resumed")
        assert announced.run_id == run_id and announced.details["version"] == resumed["resumed_from"]
        assert report["epochs"] == 3 and report["final_accuracy"] > 0.7
        assert sorted(report["workers"]) == ["worker-1", "worker-2"]
    finally:
        wire.close()


def test_the_units_command_sigtermed_exits_0_with_a_checkpoint_and_resumes(
    tls_broker: TlsBroker, cluster: str, tmp_path: Path, tls_workers: list[WorkerProcess]
) -> None:
    """`systemctl stop` was a SIGKILL (no handler). Now SIGTERM writes the newest consistent state, says
    the run is suspended (an event, the retained status "left" naming the run), exits 0 at once, and the
    same command resumes the run from that checkpoint."""
    wire, report, run_id, _ = _killed_and_rerun(tls_broker, cluster, tmp_path, signal.SIGTERM)
    try:
        (suspended,) = wire.events("run-suspended")
        version = suspended.details["version"]
        assert suspended.run_id == run_id and version >= 40 and version % 20 == 0
        status = [
            m for _, s, m in wire.seen if isinstance(m, Status) and s == "central" and m.state == "left"
        ]
        assert status and status[0].run_id == run_id and "suspended" in status[0].detail
        assert report["run_id"] == run_id
        (resumed,) = [r for r in report["recoveries"] if r.get("case") == "central"]
        assert resumed["resumed_from"] == version
        assert report["timeline"][0]["batch"] == version
        assert report["epochs"] == 3 and report["final_accuracy"] > 0.7
    finally:
        wire.close()


# -- the worker's unit ------------------------------------------------------------------------------


def test_the_worker_units_command_takes_its_id_from_worker_yaml(
    tls_broker: TlsBroker, cluster: str, tmp_path: Path
) -> None:
    """The worker unit passes only --config, and the worker took the host name as its id whatever
    worker.yaml's device_id said: its login (the id) was refused, or every Pi named "raspberrypi" was one
    device. Now the id is worker.yaml's (--id still overrides it; the host name only when neither says)."""
    site = tls_broker.site
    state, creds = tmp_path / "state", tmp_path / "state" / "credentials"
    creds.mkdir(parents=True)
    pair = site.devices["worker-1"]
    for name, source in (("ca.pem", site.ca.cert), ("device.pem", pair.cert), ("device.key", pair.key)):
        shutil.copyfile(source, creds / name)
    data = yaml.safe_load(WORKER_YAML.read_text())
    data.pop("password_file")  # the test broker has no logins
    data.update(broker=tls_broker.url, cluster=cluster, device_id="worker-1", threads=1)
    config = tmp_path / "worker.yaml"
    config.write_text(yaml.safe_dump(data))
    program = Path(sys.executable).with_name("edgeagent")
    argv = ServiceUnit.read(WORKER_UNIT).command(
        program=program, state=state, credentials=creds, files={"/etc/edgeagent/worker.yaml": config}
    )
    wire = Wire(tls_broker.url, cluster, site)
    proc = subprocess.Popen(argv, env=service_env(state), cwd=state)
    try:
        seen = wire.wait("worker-1's announcement", idle_announce_of("worker-1"), timeout=60)
        assert seen is not None
        assert not [s for _, s, m in wire.seen if isinstance(m, Announce) and s != "worker-1"]
    finally:
        proc.terminate()
        proc.wait(15)
        wire.close()


# -- runs that share a directory --------------------------------------------------------------------


def test_a_checkpoint_of_another_run_never_overwrites_this_runs(
    amqtt_url: str, cluster: str, tmp_path: Path
) -> None:
    """Two runs of the same configuration, one after the other, with the same --checkpoint: the second
    overwrote the first one's checkpoint (run 5739.../v80 became 8c81.../v40). Now each run writes its
    own files, and the first run's are left as they were."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    command = [
        *(sys.executable, "-m", "edgeagent", "central", "--workers", "0"),
        *("--broker", amqtt_url, "--cluster", cluster, "--epochs", "1", "--global-every", "20"),
        *("--checkpoint", str(folder / "central.ckpt"), "--log-level", "WARNING"),
    ]
    first = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert first.returncode == 0, first.stderr[-3000:]
    before = checkpoints_under(folder)
    assert before, "the first run wrote no checkpoint"
    first_runs = {torch.load(p, weights_only=True)["run_id"] for p in before}

    second = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert second.returncode == 0, second.stderr[-3000:]
    after = checkpoints_under(folder)
    for path, data in before.items():
        assert after.get(path) == data, f"{path} of the first run was overwritten or removed"
    runs = {p: torch.load(p, weights_only=True)["run_id"] for p in after if p not in before}
    assert runs, "the second run wrote no checkpoint of its own"
    assert not set(runs.values()) & first_runs, "the second run took the first one's id"


# -- a full disk ------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """A tmpfs of a given size (root only; skipped otherwise), unmounted afterwards."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
            capture_output=True,
            check=False,
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs: {proc.stderr.decode(errors='replace').strip()}")
        mounted.append(point)
        return point

    try:
        yield mount
    finally:
        for point in mounted:
            subprocess.run(["umount", "-l", str(point)], check=False)


def _mlp_checkpoint_floor() -> int:
    """Bytes a checkpoint of the default MLP takes at least: its weights and their momentum."""
    from edgeagent.models import ModelSpec, build_model
    from edgeagent.ops.files import torch_bytes

    state = build_model(ModelSpec("mlp", (64,), 10, ()), seed=0).state_dict()
    momentum = {k: v.clone() for k, v in state.items()}  # torch.save stores a shared tensor once
    return len(torch_bytes({"weights": state, "momentum": momentum}))


def test_a_full_disk_keeps_the_previous_checkpoint_and_training_goes_on(
    amqtt_url: str, cluster: str, tmp_path: Path, small_disk: Callable[[int], Path]
) -> None:
    """A full disk crashed the central node with a raw RuntimeError from the checkpoint write and left a
    .tmp. Now a checkpoint directory with room for one checkpoint but not two: the second write fails
    with one line naming the path, the size wanted and the free space; no temporary file is left, the
    first checkpoint is intact, and the run trains to its end."""
    floor = _mlp_checkpoint_floor()
    disk = small_disk(-(-floor * 3 // 2 // 4096) * 4096)  # one checkpoint fits, two do not
    report_path = tmp_path / "report.json"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "edgeagent", "central", "--workers", "0", "--checkpoint", str(disk)),
            *("--broker", amqtt_url, "--cluster", cluster, "--epochs", "1", "--global-every", "20"),
            *("--report", str(report_path), "--log-level", "INFO"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    report = json.loads(report_path.read_text())
    assert report["batches"] == PER_EPOCH and report["epochs"] == 1  # trained to its end
    failed = [line for line in out.splitlines() if "cannot write the checkpoint" in line]
    assert len(failed) == 1, out[-3000:]  # the point of batch 40; one line for it
    line = failed[0]
    assert "v00000040.ckpt" in line and "No space left on device" in line
    assert " wanted, " in line and " free in " in line and "training goes on" in line
    (kept,) = sorted(disk.rglob("*.ckpt"))
    state = torch.load(kept, weights_only=True)
    assert kept.name == "v00000020.ckpt" and state["version"] == 20 and state["run_id"] == report["run_id"]
    assert not [p for p in disk.rglob("*") if p.name.endswith(".tmp")]


# -- workers whose central node is gone ---------------------------------------------------------------


def test_workers_leave_a_run_whose_central_node_stays_offline(
    amqtt_url: str, cluster: str, tmp_path: Path
) -> None:
    """Workers stayed in the run of a dead central node forever (only idle or left ended it). Now they
    leave it once the central node has been offline (its last will) for ten of its heartbeat intervals,
    at least their floor, and announce themselves idle."""
    interval, floor = 0.4, 1.0
    window = max(floor, 10 * interval)
    config = tmp_path / "central.yaml"
    config.write_text(yaml.safe_dump({"heartbeat_interval": interval, "train": {"epochs": 50}}))
    procs = [
        subprocess.Popen(
            worker_command(
                f"worker-{i}",
                amqtt_url,
                cluster,
                1.0,
                once=False,
                extra=("--central-offline-floor", str(floor)),
            )
        )
        for i in (1, 2)
    ]
    wire = Wire(amqtt_url, cluster)
    central = Central(
        [
            *(sys.executable, "-m", "edgeagent", "central", "--config", str(config), "--workers", "2"),
            *("--broker", amqtt_url, "--cluster", cluster, "--checkpoint", "off", "--log-level", "WARNING"),
        ],
        tmp_path,
        service_env(tmp_path),
        tmp_path / "central.log",
    )

    try:
        for device in ("worker-1", "worker-2"):
            wire.wait(f"{device} training", status_of(device, "training"), timeout=120, central=central)
        central.proc.send_signal(signal.SIGKILL)
        central.proc.wait(10)
        offline, _ = wire.wait("the central node's last will", status_of("central", "offline"), timeout=30)
        for device in ("worker-1", "worker-2"):
            idle, _ = wire.wait(
                f"{device} idle", status_of(device, "idle"), timeout=window + 30, after=offline
            )
            # Not before the window (less the broker's delivery to the worker), not much after it.
            assert window - 0.5 <= idle - offline <= window + 15, idle - offline
            wire.wait(f"{device} announcing itself idle", idle_announce_of(device), timeout=15, after=idle)
        assert all(p.poll() is None for p in procs), "a worker exited instead of waiting for the next run"
    finally:
        central.stop()
        wire.close()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(15)


# -- the watchdog through a broker outage -------------------------------------------------------------


class Pets:
    """Where systemd would listen (``$NOTIFY_SOCKET``): when each notification came."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.got: list[tuple[float, str]] = []
        self.changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096).decode()
            except TimeoutError:
                continue
            with self.changed:
                self.got.extend((time.monotonic(), f) for f in data.split("\n"))
                self.changed.notify_all()

    def wait(self, field: str, n: int, *, after: float, timeout: float) -> list[float]:
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                times = [t for t, f in self.got if f == field and t >= after]
                if len(times) >= n:
                    return times
                left = deadline - time.monotonic()
                assert left > 0, f"{len(times)} of {n} {field} in {timeout:g} s"
                self.changed.wait(min(left, 0.5))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def test_a_broker_outage_longer_than_the_watchdog_does_not_stop_the_pets(
    tmp_path: Path, cluster: str
) -> None:
    """The watchdog was petted only while connected: a broker outage longer than WatchdogSec made systemd
    kill the central node (and restart it into a new run). Now the pets go on while the MQTT loop and the
    scheduler run, connected or not: through an outage of several WatchdogSec no gap reaches it."""
    import shutil

    from tests.conftest import MosquittoProcess

    if shutil.which("mosquitto") is None:
        pytest.skip("the mosquitto binary is not installed")
    watchdog_sec = 1.0
    pets = Pets(tmp_path / "notify.sock")
    broker = MosquittoProcess(tmp_path).start()
    env = {
        **service_env(tmp_path),
        "NOTIFY_SOCKET": str(pets.path),
        "WATCHDOG_USEC": str(int(watchdog_sec * 1e6)),  # pets every 0.5 s
    }
    # Waits in discovery for a worker that never comes (startup_timeout 60 s): alive, connected, idle.
    central = Central(
        [
            *(sys.executable, "-m", "edgeagent", "central", "--workers", "1", "--checkpoint", "off"),
            *("--broker", broker.url, "--cluster", cluster, "--log-level", "WARNING"),
        ],
        tmp_path,
        env,
        tmp_path / "central.log",
    )
    try:
        pets.wait("READY=1", 1, after=0.0, timeout=60)
        pets.wait("WATCHDOG=1", 2, after=0.0, timeout=10)
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGKILL)
        broker.proc.wait(10)
        down = time.monotonic()
        # Six pets while the broker is down: three WatchdogSec of outage.
        times = pets.wait("WATCHDOG=1", 6, after=down, timeout=3 * watchdog_sec + 10)
        gaps = [b - a for a, b in zip([down, *times], times, strict=False)]
        assert max(gaps) < watchdog_sec, gaps
        assert central.proc.poll() is None, central.output()[-3000:]
        assert "lost the broker" in central.output()  # the outage was seen: the pets went on all the same
        broker.start()
        central.proc.send_signal(signal.SIGTERM)  # still discovering: it ends cleanly, exit 0
        assert central.wait(timeout=30) == 0, central.output()[-3000:]
    finally:
        central.stop()
        broker.stop()
        pets.close()
