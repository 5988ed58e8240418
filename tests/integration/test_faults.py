"""Fault tolerance with real processes, real SIGKILLs and a real broker restart.

Faults are deterministic by (device, batch): a worker kills itself with SIGKILL when that batch starts
its backward pass (``--kill``), or the test acts when the central node commits a given batch.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from edgeagent.cli.demo import LocalWorkers
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.modes import mode
from edgeagent.replication.period import RATE_WINDOW
from edgeagent.roles.central import Central, RunReport
from tests.helpers import LocalCluster

pytestmark = pytest.mark.slow


def run(
    broker: str,
    *,
    workers: int = 2,
    kills: dict[str, int | str] | None = None,
    on_batch: Callable[[int, LocalWorkers], None] | None = None,
    save: Path | None = None,
    watch_restart: bool = False,
    **central: Any,
) -> RunReport:
    """Central node in this process, workers as processes; ``on_batch`` runs as batches commit."""
    train = central.pop("train", TrainConfig(epochs=3))
    # Killed workers stay dead unless a test restarts them: recover without waiting for them to come back.
    central.setdefault("restart_window", 30.0 if watch_restart else 0.0)

    def progress(values: dict[str, Any], _node: Central, local: LocalWorkers) -> None:
        if on_batch is not None and "batch" in values:
            on_batch(values["batch"], local)

    cluster = LocalCluster(
        broker,
        workers=workers,
        on_progress=progress,
        worker_options={"kills": kills},
        train=train,
        save_model=str(save) if save else None,
        **central,
    )
    local = cluster.local
    stop = threading.Event()

    def restarter() -> None:
        # Like systemd's Restart=on-failure: start a worker again, with its id, as soon as it dies.
        restarted: set[str] = set()
        while not stop.wait(0.05):
            for device, proc in list(local.procs.items()):
                if proc.poll() is not None and device not in restarted and proc.returncode != 0:
                    restarted.add(device)
                    local.restart(device)

    watcher = threading.Thread(target=restarter, daemon=True)
    if watch_restart:
        watcher.start()
    try:
        return cluster.node.run()
    finally:
        stop.set()  # before the workers stop: the restarter must not start them again
        local.stop()


def run_with_newcomer(
    broker: str,
    config: CentralConfig,
    local: LocalWorkers,
    newcomer: str,
    at: int,
    *,
    dies_at: int | None = None,
) -> RunReport:
    """Run the central node; when batch ``at`` commits, start ``newcomer`` and pause training until it is on
    the broker (its idle status is there, its announce on its way), so no test depends on how fast a
    process starts. With ``dies_at``, when that batch commits, SIGKILL it and pause until the broker has
    published its last will. (The progress hook runs on the central node's own thread: it reads what
    arrived meanwhile once the hook returns.)"""
    from edgeagent.protocol.messages import Status
    from edgeagent.protocol.topics import Family, Topics
    from edgeagent.protocol.wire import decode
    from edgeagent.transport.mqtt import MqttTransport

    states = {"idle": threading.Event(), "offline": threading.Event()}
    watcher = MqttTransport(broker, f"watch-{config.cluster}")

    def on_status(topic: str, payload: bytes) -> None:
        _, msg = decode(payload)
        if isinstance(msg, Status) and msg.state in states:
            states[msg.state].set()

    watcher.subscribe(Topics(config.cluster).device(Family.STATUS, newcomer), on_status)

    def progress(values: dict[str, Any]) -> None:
        batch = values.get("batch")
        if batch == at and newcomer not in local.procs:
            local.start(newcomer)
            assert states["idle"].wait(60), f"{newcomer} did not come up"
        elif batch is not None and batch == dies_at and not states["offline"].is_set():
            local.procs[newcomer].kill()
            assert states["offline"].wait(60), f"the broker did not publish {newcomer}'s last will"

    try:
        return Central(config, progress=progress, modes=mode).run()
    finally:
        watcher.close()
        local.stop()


def test_sigkill_one_worker_recovers_and_matches_the_fault_free_accuracy(amqtt_url: str) -> None:
    # Ten epochs: compare converged runs, not two points on a still-rising curve.
    clean = run(amqtt_url, train=TrainConfig(epochs=10))
    faulty = run(amqtt_url, train=TrainConfig(epochs=10), kills={"worker-1": 70})

    (rec,) = faulty.recoveries
    assert rec["case"] == 3 and rec["lost"] == ["worker-1"]
    # Deterministic: worker-1 dies when batch 70 starts its backward pass, after what it sent before
    # reached the broker; the central node applies the gradients of 69 before it acts on the last will.
    assert rec["batch"] == 70 and rec["rolled_back_to"] == 50  # the chain replica of batch 50
    assert rec["batches_replayed"] == 20
    assert rec["detected_at"] <= rec["resumed_at"]
    assert faulty.partitions[-1]["points"][0] == 0 and len(faulty.partitions[-1]["points"]) == 3
    assert faulty.batches == clean.batches
    # Throughput counts every batch of the run once: the 20 replayed batches are time lost, not work.
    assert faulty.samples_per_second * faulty.train_seconds == pytest.approx(faulty.batches * 32, rel=1e-6)
    assert abs(faulty.final_accuracy - clean.final_accuracy) <= 0.02, (
        clean.final_accuracy,
        faulty.final_accuracy,
    )


def test_a_period_in_seconds_is_retuned_to_the_measured_rate_and_the_recovery_uses_it(amqtt_url: str) -> None:
    """--chain-seconds (ResPipe's T): the first period comes from the central node's profile, which leaves
    the links out (a tiny MLP: hundreds of batches for 0.05 s); once the plan has committed RATE_WINDOW
    batches it is retuned to the measured rate from a batch past every stage, and the fault rolls back to
    a point of the retuned period (never re-split, no global replicas: the chain replicas alone)."""
    report = run(
        amqtt_url,
        kills={"worker-1": 120},
        partition="uniform",
        global_every=0,
        chain_seconds=0.05,
    )
    first, *_ = report.chain_periods
    bound = 3  # batches in flight: the number of stages
    assert first["batch"] == RATE_WINDOW and first["from_batch"] == RATE_WINDOW + 2 * bound + 8
    assert report.partitions[0]["chain_every"] > first["chain_every"] >= 1, (report.partitions, first)
    (rec,) = report.recoveries
    assert rec["batch"] == 120 and rec["lost"] == ["worker-1"]
    back = rec["rolled_back_to"]
    assert back >= first["from_batch"] and (back - first["from_batch"]) % first["chain_every"] == 0, rec
    assert len(report.test_accuracy_per_epoch) == 3  # the run went on to its end


def test_no_update_is_lost_or_applied_twice(amqtt_url: str, tmp_path: Path) -> None:
    """Without staleness (in_flight=1) the split does not change the arithmetic, so a run with a fault,
    its rollback and its replay must end with the same weights as a run without one."""
    train = TrainConfig(epochs=2, in_flight=1, staleness="none")
    run(amqtt_url, train=train, save=tmp_path / "clean.pt")
    faulty = run(amqtt_url, train=train, kills={"worker-2": 60}, save=tmp_path / "faulty.pt")
    assert faulty.recoveries and faulty.recoveries[0]["batches_replayed"] == 10
    clean_w = torch.load(tmp_path / "clean.pt", weights_only=True)
    faulty_w = torch.load(tmp_path / "faulty.pt", weights_only=True)
    assert clean_w.keys() == faulty_w.keys()
    for key in clean_w:
        torch.testing.assert_close(faulty_w[key], clean_w[key], rtol=1e-5, atol=1e-6)


def test_two_workers_at_once_recover_from_the_global_replica(amqtt_url: str) -> None:
    def kill_two(batch: int, local: LocalWorkers) -> None:
        if batch == 130:
            for device in ("worker-1", "worker-2"):
                os.kill(local.procs[device].pid, signal.SIGKILL)

    train = TrainConfig(epochs=4, model_options={"hidden": [128, 128, 64]})  # 4 layers for 4 stages
    report = run(amqtt_url, workers=3, train=train, on_batch=kill_two)
    (rec,) = report.recoveries
    assert rec["lost"] == ["worker-1", "worker-2"]
    # worker-1's chain replica lived on worker-2, which died too: the global replica (batch 100) serves.
    assert rec["rolled_back_to"] == 100
    assert report.partitions[-1]["points"] and len(report.partitions[-1]["points"]) == 3
    assert report.epochs == 4
    assert report.final_accuracy > 0.3  # learning goes on (chance: 0.1); this deep MLP learns slowly at K=4


def test_worker_restarted_with_the_same_id_rejoins(amqtt_url: str) -> None:
    # The default windows: a device restarted by systemd comes back well within them (case 2).
    report = run(amqtt_url, kills={"worker-1": 70}, watch_restart=True)
    (rec,) = report.recoveries
    assert rec["case"] == 2 and rec["restarted"] == ["worker-1"] and rec["lost"] == []
    assert rec["workers"] == ["worker-1", "worker-2"]  # same pipeline as before
    assert report.final_accuracy > 0.7


def test_broker_killed_and_restarted_mid_run(tmp_path: Path) -> None:
    """Mosquitto dies with SIGKILL at batch 60 and comes back on the same port; every role reconnects."""
    import shutil

    from tests.conftest import MosquittoProcess

    if shutil.which("mosquitto") is None:
        pytest.skip("the mosquitto binary is not installed")
    broker = MosquittoProcess(tmp_path).start()
    bounced = threading.Event()

    def bounce(batch: int, local: LocalWorkers) -> None:
        if batch == 60 and not bounced.is_set():
            bounced.set()
            assert broker.proc is not None
            broker.proc.send_signal(signal.SIGKILL)
            broker.proc.wait(10)
            broker.start()

    try:
        report = run(broker.url, on_batch=bounce, batch_timeout=3.0)
    finally:
        broker.stop()
    assert bounced.is_set()
    assert report.epochs == 3 and report.final_accuracy > 0.7
    for rec in report.recoveries:
        assert rec["case"] == 1 and rec["lost"] == []  # everybody came back: nobody was dropped


def test_a_new_device_joins_a_run_in_progress(amqtt_url: str) -> None:
    cluster = f"t{uuid.uuid4().hex[:8]}"
    local = LocalWorkers(2, amqtt_url, cluster, [1.0, 1.0])
    local.start("worker-1")
    train = TrainConfig(epochs=3)  # the default MLP: a layer range for each of the three stages
    config = CentralConfig(
        cluster=cluster, broker=amqtt_url, workers=1, train=train, progress=False, repartition_every=20
    )
    report = run_with_newcomer(amqtt_url, config, local, "worker-2", at=15)
    joined = [p for p in report.partitions if "worker-2" in p.get("workers", [])]
    assert joined, report.partitions
    assert len(joined[0]["points"]) == 4  # three stages from the join on
    assert joined[0]["batch"] > 15
    assert report.final_accuracy > 0.7


def test_a_newcomer_that_dies_before_it_is_admitted_is_not_waited_for(amqtt_url: str) -> None:
    """worker-2 comes up and announces itself at batch 5 (it would join at the re-split at batch 30), then
    dies (SIGKILL) at batch 8: its last will takes it off the joiners, so no plan waits for it. Before,
    the re-split admitted it anyway and waited out the join barrier (60 s at least), then recovered."""
    cluster = f"t{uuid.uuid4().hex[:8]}"
    local = LocalWorkers(2, amqtt_url, cluster, [1.0, 1.0])
    local.start("worker-1")
    config = CentralConfig(
        cluster=cluster,
        broker=amqtt_url,
        workers=1,
        train=TrainConfig(epochs=2),
        progress=False,
        repartition_every=30,
    )
    report = run_with_newcomer(amqtt_url, config, local, "worker-2", at=5, dies_at=8)
    assert local.procs["worker-2"].returncode == -signal.SIGKILL
    assert report.recoveries == [], report.recoveries
    assert all("worker-2" not in p.get("workers", []) for p in report.partitions), report.partitions
    assert report.epochs == 2 and report.final_accuracy > 0.8  # 0.95 in three runs; chance is 0.1


def test_central_killed_and_resumed_from_its_checkpoint(amqtt_url: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    from edgeagent.roles.central import latest_checkpoint, load_checkpoint

    cluster = f"t{uuid.uuid4().hex[:8]}"
    local = LocalWorkers(2, amqtt_url, cluster, [1.0, 1.0]).start_all()
    central = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgeagent",
            "central",
            "--broker",
            amqtt_url,
            "--cluster",
            cluster,
            "--workers",
            "2",
            "--epochs",
            "8",
            "--checkpoint",
            str(tmp_path),
            "--global-every",
            "40",
            "--log-level",
            "WARNING",
            "--die-after-checkpoint",  # SIGKILL right after the first global replication point's checkpoint
            "1",
        ],
    )
    try:
        assert central.wait(timeout=120) == -signal.SIGKILL, (
            "the central node was not killed at its checkpoint"
        )
        ckpt = latest_checkpoint(tmp_path, cluster)
        assert ckpt is not None
        saved = load_checkpoint(str(ckpt))
        assert saved["version"] % 40 == 0 and saved["version"] > 0

        config = CentralConfig(broker=amqtt_url, cluster=cluster, workers=2, resume=str(ckpt), progress=False)
        report = Central(config, modes=mode).run()
    finally:
        if central.poll() is None:
            central.kill()
        local.stop()
    assert report.run_id == saved["run_id"]
    assert (
        report.recoveries[0]["case"] == "central" and report.recoveries[0]["resumed_from"] == saved["version"]
    )
    assert report.timeline[0]["batch"] == saved["version"]  # nothing before the checkpoint is redone
    assert report.epochs == 8
    assert report.final_accuracy > 0.7


def test_recovery_after_a_re_split_restores_the_new_layout(amqtt_url: str) -> None:
    """Snapshots taken before a re-split have the old layer ranges; a fault after the re-split must
    roll back to a snapshot of the new layout (every device snapshots and replicates at the commit).

    Deterministic: the chain replica of batch 50 has the old layout; a new device joins at the plan
    check of batch 70 (a join always re-splits); worker-2 dies when batch 90 starts its backward pass.
    """
    cluster = f"t{uuid.uuid4().hex[:8]}"
    local = LocalWorkers(3, amqtt_url, cluster, [1.0, 1.0, 1.0], kills={"worker-2": 90})
    local.start("worker-1")
    local.start("worker-2")
    train = TrainConfig(epochs=3, model_options={"hidden": [128, 128, 64]})
    config = CentralConfig(
        cluster=cluster,
        broker=amqtt_url,
        workers=2,
        train=train,
        progress=False,
        repartition_every=20,
        restart_window=0.0,
    )
    report = run_with_newcomer(amqtt_url, config, local, "worker-3", at=55)
    (rec,) = report.recoveries
    joined = [p for p in report.partitions if "worker-3" in p.get("workers", [])]
    assert joined and 50 < joined[0]["batch"] < rec["batch"], report.partitions
    assert rec["lost"] == ["worker-2"]
    assert rec["rolled_back_to"] >= joined[0]["batch"]  # not the chain replica of 50: its layout is gone
    assert report.epochs == 3


class CuttableRelay:
    """A TCP relay to the broker for the workers (the central node connects directly). :meth:`cut` closes
    every relayed connection and refuses new ones for a while, as a broker restart does to its clients,
    here to the workers alone: the central node probes while they are away."""

    def __init__(self, broker_port: int) -> None:
        import socket

        self.broker_port = broker_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.lock = threading.Lock()
        self.pairs: list[tuple[Any, Any]] = []
        self.refuse_until = 0.0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import contextlib
        import socket
        import time

        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.server.accept()
                with self.lock:
                    if time.monotonic() < self.refuse_until:
                        conn.close()
                        continue
                    up = socket.create_connection(("127.0.0.1", self.broker_port))
                    self.pairs.append((conn, up))
                for a, b in ((conn, up), (up, conn)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: Any, dst: Any) -> None:
        import contextlib

        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.close()

    def cut(self, seconds: float) -> None:
        import contextlib
        import socket
        import time

        with self.lock:
            self.refuse_until = time.monotonic() + seconds
            for pair in self.pairs:
                for s in pair:
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)
                        s.close()
            self.pairs.clear()

    def close(self) -> None:
        self.cut(0)
        self.server.close()


def test_workers_off_the_broker_when_the_probe_goes_out_are_asked_again(amqtt_url: str) -> None:
    """After a broker restart (bench/chaos.py) the central node reconnected first, probed, and the workers,
    still reconnecting, never saw its one ping: at the end of the restart window every worker was taken for
    gone (case 3, the central node alone). Here the workers' connections are cut for 3 s at batch 40, their
    last wills start the probe while they are away; asked again, they answer: case 1, nobody dropped."""
    from edgeagent.transport.mqtt import BrokerUrl

    relay = CuttableRelay(BrokerUrl.parse(amqtt_url).port)
    cut = threading.Event()

    def cut_at_40(batch: int, local: LocalWorkers) -> None:
        if batch == 40 and not cut.is_set():
            cut.set()
            relay.cut(3.0)

    cluster = f"t{uuid.uuid4().hex[:8]}"
    config = CentralConfig(
        cluster=cluster, broker=amqtt_url, workers=2, train=TrainConfig(epochs=2), progress=False
    )  # the default restart window (30 s): longer than the workers' time away
    local = LocalWorkers(2, f"mqtt://127.0.0.1:{relay.port}", cluster, [1.0, 1.0]).start_all()

    def progress(values: dict[str, Any]) -> None:
        if "batch" in values:
            cut_at_40(values["batch"], local)

    try:
        report = Central(config, progress=progress, modes=mode).run()
    finally:
        local.stop()
        relay.close()
    assert cut.is_set() and report.recoveries, "the cut did not start a recovery"
    for rec in report.recoveries:
        assert rec["case"] == 1 and rec["lost"] == [], rec  # everybody answered: nobody was dropped
    assert report.partitions[-1].get("workers", ["worker-1", "worker-2"]) == ["worker-1", "worker-2"]
    assert report.epochs == 2
