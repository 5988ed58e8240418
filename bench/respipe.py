"""ResPipe's experiments (papers/002): Fig. 3 (a worker switching off and on) and the z/T trade-off.

    python bench/respipe.py fig3 [--off 3,10] [--on 10] [--scale 2] [--epochs 12] [--arms ...]
    python bench/respipe.py zt [--periods 0.5,2] [--epochs 5]
    python bench/respipe.py all

Not a part of ``bench/recovery.py``: that bench kills a worker once in FTPipeHD's scenario; these need a
worker that comes back, a data-parallel arm and replication settings swept, with other models and data.

**fig3** (the paper's Sec. 5, Fig. 3(a)-(b)): its CNN (``cnn``: C8, M2, C16, M2, C32, M2, F128, F10, one conv
or pool per layer; sigmoid in the paper, ReLU here) on digits upsampled to 28x28 (``digits28``, 1437
training images: MNIST-shaped, not MNIST), the central node and three workers, batch 32. Worker 2 (the
middle one, the paper's "second worker") runs ``--on`` seconds, is stopped (SIGSTOP) for ``--off`` seconds
and goes on (SIGCONT), over and over, from the first batch to the end. The paper's 5 min ON and 1.5 or 5
min OFF are scaled by ``--scale`` seconds per paper minute (default 2: ON 10 s, OFF 3 s and 10 s), its
T = 30 s likewise (1 s: ``--chain-seconds``). Arms, each a whole run:

* ``respipe``: ResPipe as papers/002 has it: PipeDream's equal split, never re-split; replicas to the
  next worker (z = 1) every T seconds (``--chain-seconds``), at once (``--replica-share 0``: otherwise the
  central node holds every stage's replica as well), no global ones; a stopped worker is
  detected by its missed heartbeats (0.5 s interval) and the next worker takes over its layers from the
  replica (``--recovery respipe``). A worker that comes back is not taken in again (ResPipe never
  re-splits), so only the first OFF costs it a recovery.
* ``pipedream``: PipeDream, no fault tolerance: the same split, no replicas, no detection (the worker's
  heartbeats every 20 s, a 120 s batch timer): the pipeline waits while the worker is off and goes on
  when it is back, as a stalled pipeline does (a PipeDream worker that really dies ends the run).
* ``data-parallel``: data-distributed training as the paper's Fig. 1(a), a master that holds the model:
  ``--mode allreduce --collective ps-sync`` (the central node is the parameter server; every step waits
  for every member's gradient); a stopped member is excluded after its missed heartbeats and the step
  runs again over the others; when it is back it is assigned again with the current model. The allreduce
  mode lets heartbeats come 10 s late (``_LATE_HEARTBEATS``), so an OFF shorter than 11.5 s is waited out.
* ``ftpipehd`` (ours, not in the paper; ``--arms`` adds it): FTPipeHD's recovery (re-split over the
  survivors) with the same T, and the worker that comes back joins at the next re-split. Its DP re-split
  after 10 batches makes it several times faster than the equal split on this CNN (activations dominate),
  so it finishes before the OFFs matter: not a like-for-like arm.

The paper prints no numbers for Fig. 3 (its curves did not survive the text conversion); its claims are:
ResPipe's accuracy over time is above data-parallel training's (less communication) and above
PipeDream's (resilience), and the gap to PipeDream grows when OFF grows from 1.5 to 5 min. The machine is
shared (2 cores, other jobs): an arm's pace moves 2-4x between runs, so the figure is a ratio inside each
run: **kept**, the work (share of the run's batches) done while the worker is off over the rate of the
same run's ON time (the first OFF, and all of them), and the seconds lost to the OFFs. Then the test
accuracy at every epoch's end against the seconds since the first batch, at fixed times (a third, two
thirds and the end of the shortest run), the seconds to 90 % of the best final accuracy and the bytes
sent per second (all devices' uplinks): absolute times, so across runs only roughly.

**zt** (Theorem 1: ResPipe's communication is O(zLK^2/T) against O(NLK^2) for data-parallel and O(NK)
for a pipeline; no measured figure in the paper): the same model and devices, fault-free runs sweeping
the replication fan-out z (``--replicas``) and the period T (``--chain-seconds``), against no
replication (a plain pipeline) and ps-sync data-parallel: the bytes published on the broker per epoch
(an observer subscribed to all of the run's topics), replicas apart, and the replica traffic per second
beside Theorem 1's z x (the workers' stage bytes, weights and momentum) / T, with the period in batches
and in seconds as realised. A sender publishes a chain replica once and the broker hands it to each of
its z holders, so z multiplies what is delivered, not what a device sends (ResPipe's D2D links send z
copies): "delivered" is z x published. Then the recovery cost:
worker 2 killed (SIGKILL) at batch ``--kill-at`` for each T (z = 1): batches rolled back and the seconds
lost; and workers 1 and 2, neighbours, killed at once for z = 1 and z = 2 (the first T): with z = 1
worker 1's only replica died with worker 2 and the run restarts from the seeded model (no global
replicas, as ResPipe); with z = 2 it rolls back to the last period.

How the set-ups differ from the paper's: processes on one 2-core machine over MQTT on loopback instead
of Nexus 6P phones over Wi-Fi Direct; minutes scaled to seconds; digits28 instead of MNIST; the master
(central node) computes stage 0 (in the paper it only holds the data); a worker stopped by SIGSTOP
instead of a phone switched off; ResPipe's T turned into batches at the measured rate
(``edgeagent.replication.period``), replicas versioned by batch.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.allreduce import Broker
from edgeagent.cli.demo import LocalWorkers
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.models import ModelSpec, build_model
from edgeagent.modes import mode
from edgeagent.ops.logs import setup_logging
from edgeagent.ops.report import recovery_times
from edgeagent.protocol.topics import Topics
from edgeagent.roles.central import Central, RunReport
from edgeagent.transport.mqtt import MqttTransport

DATASET, MODEL, BATCH, WORKERS = "digits28", "cnn", 32, 3
# Lower than the default 0.05 so that the run takes several ON/OFF cycles to converge, as the paper's
# 20-minute curves do (at 0.05 the CNN is at 97 % on digits28 after 2 epochs, before the first OFF).
LEARNING_RATE = 0.005
VICTIM = "worker-2"  # the paper's "second worker"
PAPER_ON_MIN, PAPER_OFFS_MIN, PAPER_T_S = 5.0, (1.5, 5.0), 30.0
PIPEDREAM_HEARTBEAT, FAST_HEARTBEAT = 20.0, 0.5

# arm -> (CentralConfig settings, extra flags of every worker); "chain_seconds" is filled in per run.
# A stopped worker is found after 3 missed heartbeats of its own interval, taken as at least the central
# node's (planner.deadlines.silence): both 0.5 s where the arm detects it, so that it is found within the
# scaled OFF time (1.5 s of silence; the default 1 s makes 3 s, the whole of a 1.5-minute OFF).
_FAST = ("--heartbeat-interval", str(FAST_HEARTBEAT))
ARMS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "respipe": (
        {
            "partition": "uniform",
            "recovery": "respipe",
            "global_every": 0,
            # Replicas at once to their z holders only: with a share of a slow uplink (the default
            # 0.25) the central node listens to every worker's replica topic and holds every stage's
            # replica too (a z + 1st holder: two dead neighbours at z = 1 would roll back to it).
            "replica_share": 0.0,
            "heartbeat_interval": FAST_HEARTBEAT,
        },
        _FAST,
    ),
    "pipedream": (
        {"partition": "uniform", "chain_every": 0, "global_every": 0, "batch_timeout": 120.0},
        ("--heartbeat-interval", str(PIPEDREAM_HEARTBEAT)),
    ),
    "data-parallel": (
        {"mode": "allreduce", "collective": "ps-sync", "heartbeat_interval": FAST_HEARTBEAT},
        _FAST,
    ),
    "ftpipehd": (
        {"partition": "dynamic", "recovery": "ftpipehd", "heartbeat_interval": FAST_HEARTBEAT},
        _FAST,
    ),
}
TIMED = ("respipe", "ftpipehd")  # the arms whose chain period is T in seconds


@dataclass
class Trace:
    """What a run's progress hook saw, in seconds since its first batch: every epoch's test accuracy and
    the share of the run's batches done (a rollback's replays move it back: work lost)."""

    started: float = 0.0
    points: list[tuple[float, float]] = field(default_factory=list)  # (s, accuracy)
    progress: list[tuple[float, float]] = field(default_factory=list)  # (s, batches done / total)
    first_batch: threading.Event = field(default_factory=threading.Event)

    def hook(self, values: dict[str, Any]) -> None:
        now = time.monotonic()
        if "batch" in values and not self.first_batch.is_set():
            self.started = now
            self.first_batch.set()
        if not self.first_batch.is_set():
            return
        if values.get("accuracy") is not None:
            self.points.append((now - self.started, float(values["accuracy"])))
        if "batch" in values and values.get("total"):
            self.progress.append((now - self.started, int(values["batch"]) / int(values["total"])))

    def done_at(self, t: float) -> float:
        """The share of the run done at ``t`` seconds (the last report at or before it)."""
        seen = [p for s, p in self.progress if s <= t]
        return seen[-1] if seen else 0.0

    def kept(self, offs: list[tuple[float, float]]) -> tuple[float | None, float | None, float]:
        """(first OFF's rate, all OFFs' rate) over the ON time's rate, and the seconds lost to the OFFs
        (their length times the share of the ON rate they missed): ratios inside one run, so that the load
        of the shared machine, which differs between runs, mostly cancels."""
        end = self.progress[-1][0] if self.progress else 0.0
        windows = [(a, min(b, end)) for a, b in offs if a < end]
        off_time = sum(b - a for a, b in windows)
        if not windows or end - off_time <= 0:
            return None, None, 0.0
        gained = [self.done_at(b) - self.done_at(a) for a, b in windows]
        on_rate = (self.done_at(end) - sum(gained)) / (end - off_time)
        if on_rate <= 0:
            return None, None, 0.0
        first = gained[0] / (windows[0][1] - windows[0][0]) / on_rate
        every = sum(gained) / off_time / on_rate
        return first, every, off_time * (1 - every)


class OnOff(threading.Thread):
    """Stops ``proc`` (SIGSTOP) for ``off`` seconds after every ``on`` seconds of the run, from its first
    batch, until ``done`` is set; the intervals it was off are kept."""

    def __init__(self, workers: LocalWorkers, device: str, on: float, off: float, trace: Trace) -> None:
        super().__init__(daemon=True)
        self.workers, self.device, self.on, self.off, self.trace = workers, device, on, off, trace
        self.done = threading.Event()
        self.offs: list[tuple[float, float]] = []

    def run(self) -> None:
        if not self._wait_first_batch():
            return
        while not self.done.wait(self.on):
            proc = self.workers.procs[self.device]
            if proc.poll() is not None:
                return
            began = time.monotonic() - self.trace.started
            os.kill(proc.pid, signal.SIGSTOP)
            self.done.wait(self.off)
            os.kill(proc.pid, signal.SIGCONT)
            self.offs.append((began, time.monotonic() - self.trace.started))

    def _wait_first_batch(self) -> bool:
        while not self.trace.first_batch.wait(0.2):
            if self.done.is_set():
                return False
        return True


def train_config(epochs: int) -> TrainConfig:
    return TrainConfig(
        model=MODEL, dataset=DATASET, epochs=epochs, batch_size=BATCH, learning_rate=LEARNING_RATE
    )


def run(
    broker: str,
    arm: str,
    epochs: int,
    *,
    on_off: tuple[float, float] | None = None,
    kills: dict[str, int | str] | None = None,
    together: tuple[int, list[str]] | None = None,
    watch: bool = False,
    **settings: Any,
) -> tuple[RunReport, Trace, list[tuple[float, float]], Wire | None]:
    """One run of ``arm`` (``settings`` on top of its own); ``on_off``: worker 2's ON and OFF seconds;
    ``kills``: a worker SIGKILLs itself when that batch starts its backward pass; ``together``: (batch,
    devices) SIGKILLed at once when the central node commits that batch (``--die-at-backward`` on two
    would kill the second only in the replay after the first's recovery); ``watch``: count the bytes."""
    central, flags = ARMS[arm]
    cluster = f"rp{uuid.uuid4().hex[:8]}"
    config = CentralConfig(
        cluster=cluster,
        broker=broker,
        workers=WORKERS,
        train=train_config(epochs),
        progress=False,
        restart_window=0.0,
        startup_timeout=600.0,
        metrics_interval=0.5,
        **{**central, **settings},
    )
    extra = {f"worker-{i + 1}": flags for i in range(WORKERS)}
    local = LocalWorkers(WORKERS, broker, cluster, [1.0] * WORKERS, kills=kills, threads=[1] * WORKERS)
    local.extra = extra
    trace = Trace()
    if together is not None:
        at, devices = together

        def kill(values: dict[str, Any]) -> None:
            trace.hook(values)
            if values.get("batch") == at:
                for device in devices:
                    os.kill(local.procs[device].pid, signal.SIGKILL)

        progress: Callable[[dict[str, Any]], None] = kill
    else:
        progress = trace.hook
    switcher = OnOff(local, VICTIM, *on_off, trace) if on_off else None
    wire = Wire(broker, cluster) if watch else None
    local.start_all()
    try:
        if switcher is not None:
            switcher.start()
        report = Central(config, progress=progress, modes=mode).run()
    finally:
        if switcher is not None:
            switcher.done.set()
            switcher.join()
        local.stop(grace=5)
        if wire is not None:
            wire.close()
    return report, trace, switcher.offs if switcher else [], wire


def bytes_moved(report: RunReport) -> tuple[float, float]:
    """(sent, received) bytes of every device as its last metrics said."""
    sent = sum(float(d.get("bytes_sent", 0)) for d in report.devices)
    received = sum(float(d.get("bytes_received", 0)) for d in report.devices)
    return sent, received


def acc_at(points: list[tuple[float, float]], t: float) -> float | None:
    """The accuracy last measured at or before ``t`` seconds (None before the first evaluation)."""
    seen = [a for s, a in points if s <= t]
    return seen[-1] if seen else None


def fig3(broker: str, arms: list[str], ons: float, offs: list[float], scale: float, epochs: int) -> None:
    period = PAPER_T_S / 60.0 * scale
    print(
        f"\n== Fig. 3: {MODEL} on {DATASET}, central + {WORKERS} workers, batch {BATCH}, {epochs} epochs; "
        f"{VICTIM} ON {ons:g} s / OFF ... s (paper: {PAPER_ON_MIN:g} min ON / "
        f"{', '.join(f'{o:g}' for o in PAPER_OFFS_MIN)} min OFF; {scale:g} s per paper minute); "
        f"T = {period:g} s (paper {PAPER_T_S:g} s)",
        flush=True,
    )
    for off in offs:
        results: dict[str, tuple[RunReport, Trace, list[tuple[float, float]]]] = {}
        for arm in arms:
            extra: dict[str, Any] = {"chain_seconds": period} if arm in TIMED else {}
            started = time.monotonic()
            results[arm] = run(broker, arm, epochs, on_off=(ons, off), **extra)[:3]
            report = results[arm][0]
            print(
                f"  ran {arm} (OFF {off:g} s): final accuracy {report.final_accuracy:.1%}, "
                f"{len(report.recoveries)} recoveries ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
        _fig3_table(results, off, ons, scale)


def _fig3_table(results: dict[str, Any], off: float, on: float, scale: float) -> None:
    ends = {arm: trace.points[-1][0] for arm, (_, trace, _) in results.items() if trace.points}
    shortest = min(ends.values(), default=0.0)
    marks = [shortest / 3, 2 * shortest / 3, shortest]
    best = max((a for _, trace, _ in results.values() for _, a in trace.points), default=0.0)
    paper_off = off / scale
    print(
        f"\n-- OFF {off:g} s (paper {paper_off:g} min, Fig. 3{'(a)' if paper_off < 3 else '(b)'}): work done "
        "while the worker is off over the ON rate of the same run (first OFF, all), seconds lost to the "
        "OFFs; test accuracy at seconds since the first batch (absolute times move with the shared "
        "machine's load from run to run)"
    )
    head = "".join(f"{f'acc {m:.0f} s':>10}" for m in marks)
    print(
        f"{'arm':<15}{'kept 1st':>9}{'kept all':>9}{'lost (s)':>9}{head}{'90%best':>8}{'end (s)':>8}"
        f"{'MB/s':>7}  recoveries, OFF intervals"
    )
    for arm, (report, trace, offs) in results.items():
        first, every, lost = trace.kept(offs)
        cells = "".join(f"{_pct(acc_at(trace.points, m)):>10}" for m in marks)
        reach = next((s for s, a in trace.points if a >= 0.9 * best), None)
        sent, _ = bytes_moved(report)
        end = ends.get(arm, 0.0)
        rate = sent / end / 1e6 if end else 0.0
        spans = ", ".join(f"{a:.0f}-{b:.0f}" for a, b in offs[:4]) + (" ..." if len(offs) > 4 else "")
        print(
            f"{arm:<15}{_pct(first):>9}{_pct(every):>9}{lost:>9.1f}{cells}{_cell(reach, '{:.1f}'):>8}"
            f"{end:>8.1f}{rate:>7.1f}  {len(report.recoveries)}, {spans}"
        )
    print("  curves (s: accuracy):")
    for arm, (_, trace, _) in results.items():
        print(f"    {arm}: " + " ".join(f"{s:.0f}:{a:.2f}" for s, a in trace.points))
    paper = (
        "paper (Fig. 3(a)/(b), curves only): ResPipe above data-parallel and PipeDream; the gap to PipeDream "
        "grows with OFF (1.5 -> 5 min)"
    )
    print(f"  {paper}")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


class Wire:
    """Every byte published on the run's topics, by kind (an observer on the broker, subscribed to all):
    chain replicas (``device/<id>/replica``), the pipeline's activations and gradients (``stage/...``),
    and the rest (the allreduce mode's traffic, commands, heartbeats, metrics)."""

    def __init__(self, broker: str, cluster: str) -> None:
        self.bytes = {"replica": 0, "pipeline": 0, "other": 0}
        self.lock = threading.Lock()
        self.transport = MqttTransport(broker, f"wire-{cluster}")
        self.transport.subscribe(f"{Topics(cluster).base}/#", self.seen)

    def seen(self, topic: str, payload: bytes) -> None:
        kind = "replica" if topic.endswith("/replica") else "pipeline" if "/stage/" in topic else "other"
        with self.lock:
            self.bytes[kind] += len(payload)

    def close(self) -> None:
        self.transport.close()


def stage_replica_bytes(report: RunReport) -> float:
    """Bytes of one round of chain replicas: every worker's stage of the first split, weights and
    momentum (float32): Theorem 1's LK^2 for this model."""
    model = build_model(ModelSpec(MODEL, (1, 28, 28), 10), seed=0)
    params = [sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in model]
    points = report.partitions[0]["points"] if report.partitions else []
    return sum(2 * sum(params[points[k] : points[k + 1]]) for k in range(1, len(points) - 1))


def zt(broker: str, periods: list[float], epochs: int, kill_at: int) -> None:
    print(
        f"\n== z/T: {MODEL} on {DATASET}, central + {WORKERS} workers, batch {BATCH}, {epochs} epochs; "
        "ResPipe (equal split, chain replicas only, T in seconds retuned to the measured rate)",
        flush=True,
    )
    sweep: list[tuple[str, str, dict[str, Any]]] = [
        ("pipeline, no replicas", "pipedream", {}),
        *[
            (f"z={z} T={t:g} s", "respipe", {"chain_seconds": t, "replicas": z})
            for z in (1, 2)
            for t in periods
        ],
        ("data-parallel ps-sync", "data-parallel", {}),
    ]
    rows: list[tuple[str, dict[str, Any], RunReport, dict[str, int]]] = []
    for label, arm, settings in sweep:
        report, _, _, wire = run(broker, arm, epochs, watch=True, **settings)
        assert wire is not None
        rows.append((label, settings, report, wire.bytes))
        print(f"  ran {label}: final accuracy {report.final_accuracy:.1%}", flush=True)
    print(
        "\npublished on the broker per epoch (MB; a replica reaches its z holders: delivered = z x "
        "published), replica traffic per second against Theorem 1's z x (stage bytes) / T"
    )
    print(
        f"{'':<24}{'all':>8}{'pipeline':>10}{'replicas':>10}{'delivered':>11}{'kB/s':>8}{'z S/T kB/s':>12}"
        f"{'chain every':>13}{'T real (s)':>12}"
    )
    for label, settings, report, seen in rows:
        per = max(1, report.epochs)
        z, t = settings.get("replicas", 1), settings.get("chain_seconds")
        replica = seen["replica"]
        total = sum(seen.values())
        seconds = max(1e-9, report.train_seconds)
        theory = z * stage_replica_bytes(report) / t / 1e3 if t else 0.0
        every = report.chain_periods[-1]["chain_every"] if report.chain_periods else None
        pace = report.train_seconds / max(1, report.batches)
        real = every * pace if every else None
        print(
            f"{label:<24}{total / per / 1e6:>8.2f}{seen['pipeline'] / per / 1e6:>10.2f}"
            f"{replica / per / 1e6:>10.2f}{z * replica / per / 1e6:>11.2f}{z * replica / seconds / 1e3:>8.0f}"
            f"{theory:>12.0f}{_cell(every, '{:.0f}'):>13}{_cell(real, '{:.2f}'):>12}"
        )
    print(
        "paper (Theorem 1, no measured figure): data-parallel O(NLK^2), pipeline O(NK), ResPipe adds "
        "O(zLK^2/T)"
    )

    print(
        f"\nrecovery cost: {VICTIM} killed at batch {kill_at} (z = 1), then workers 1 and 2 at once "
        "(when the central node commits it)"
    )
    print(
        f"{'':<28}{'rolled back to':>15}{'replayed':>10}{'lost (s)':>10}{'final acc':>11}{'recoveries':>12}"
    )
    one: dict[str, Any] = {"kills": {VICTIM: kill_at}}
    cases: list[tuple[str, dict[str, Any]]] = [
        (f"1 dead, z=1 T={t:g} s", {"chain_seconds": t, **one}) for t in periods
    ]
    both: dict[str, Any] = {"together": (kill_at, ["worker-1", VICTIM])}
    first = periods[0]
    cases += [
        (f"2 dead, z={z} T={first:g} s", {"chain_seconds": first, "replicas": z, **both}) for z in (1, 2)
    ]
    for label, settings in cases:
        report, _, _, _ = run(broker, "respipe", epochs, **settings)
        rec = report.recoveries[0] if report.recoveries else {}
        cost = recovery_times(report.to_dict())
        print(
            f"{label:<28}{rec.get('rolled_back_to', '-')!s:>15}{rec.get('batches_replayed', '-')!s:>10}"
            f"{_cell(cost.lost if cost else None, '{:.2f}'):>10}{report.final_accuracy:>11.1%}"
            f"{len(report.recoveries):>12}",
            flush=True,
        )
    print(
        "paper: no recovery figure; with z = 1 two neighbours dead take the only replica of the first: "
        "the run goes back to the seeded model (no global replicas, as ResPipe)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("part", choices=("fig3", "zt", "all"))
    parser.add_argument("--arms", default="respipe,pipedream,data-parallel", help=f"of {','.join(ARMS)}")
    parser.add_argument("--scale", type=float, default=2.0, help="seconds per paper minute")
    parser.add_argument("--on", type=float, default=None, help="seconds ON (default: 5 paper minutes)")
    parser.add_argument(
        "--off", default=None, help="seconds OFF, comma-separated (default: 1.5, 5 paper min)"
    )
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--periods", default="0.5,2", help="zt: T values in seconds")
    parser.add_argument("--zt-epochs", type=int, default=4)
    parser.add_argument("--kill-at", type=int, default=150)
    args = parser.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    if not arms or any(a not in ARMS for a in arms):
        parser.error(f"--arms takes a subset of {','.join(ARMS)}")
    on = args.on if args.on is not None else PAPER_ON_MIN * args.scale
    offs = [float(o) for o in args.off.split(",")] if args.off else [o * args.scale for o in PAPER_OFFS_MIN]
    setup_logging("ERROR")
    broker = Broker()
    try:
        if args.part in ("fig3", "all"):
            fig3(broker.url, arms, on, offs, args.scale, args.epochs)
        if args.part in ("zt", "all"):
            zt(broker.url, [float(t) for t in args.periods.split(",")], args.zt_epochs, args.kill_at)
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
