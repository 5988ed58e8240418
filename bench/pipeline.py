"""Pipelining overlap, edgeagent against the pipeline a user would pick instead, and where its time goes.

    python bench/pipeline.py [--slowdown 10] [--batches 90] [--in-flight K] [--broker URL]
                             [--models mlp,mobilenetv2] [--brokers embedded,tuned,stock]
                             [--compare-batches N] [--repeats 3] [--microbatches 3]
                             [--schedule 1f1b|gpipe] [--baseline torch|sockets] [--timeout 120]
                             [--hops] [--skip-overlap] [--skip-compare] [--json FILE]

Part 1, overlap: samples/s of a 3-device pipeline with the in-flight bound at its default and at 1.
Compute dominates through ``--slowdowns S,S,S`` (each device takes S times its CPU time, sleeping the
difference, so three emulated devices do not fight over two cores). With three equal stages the
ratio approaches 3: stage 0 keeps three batches in flight and every device is busy.

Part 2, the peer: per model (``--models``), the same model (seed 0), the same split (edgeagent with
``--partition uniform``; each peer run takes ``report.partitions[0]["points"]`` of the edgeagent run it
is paired with, since the uniform split balances profiled layer times and can differ between runs;
the peer builds those very stage modules with edgeagent's ``build_layers``), the same data (the same
batches in the same order), batch 32, SGD lr 0.05 momentum 0.5 weight decay 4e-5 and one torch thread
per process, trained by edgeagent (``run_demo``: central + 2 workers) and by
``torch.distributed.pipelining`` (``Schedule1F1B``, or ``ScheduleGPipe``, over gloo on loopback, one
process per stage), with equal stages and with the third stage 4x slower. The models:

* ``mlp``: the default six-layer MLP on digits (8x8), 300 batches per run: small tensors and little
  compute per stage, so the per-message cost shows;
* ``mobilenetv2``: edgeagent's MobileNetV2 (width 0.5, 21 layers) on synthetic CIFAR-shaped data
  (``synthetic:4096:3x32x32:10``), 90 batches per run: compute-bound (about 150 ms per batch of 32 for
  the whole model on one core), activations of 30-260 kB.

``--compare-batches N`` sets the batches of every model. Each edgeagent set-up runs through each broker
(``--brokers``): the embedded amqtt broker (run_demo's own, one per run), a tuned Mosquitto
(``set_tcp_nodelay true``) and a stock one (Debian's default configuration: Nagle's algorithm on), both
started here (``mosquitto -c`` a configuration of their own on a free port; the machine's Mosquitto is not
touched), or an external one (``--broker URL``, alone unless ``--brokers`` adds more). The peer does not
use a broker: it runs once per model, set-up and repeat, and again only if the brokers' edgeagent runs
got different splits. Runs alternate (repeat, set-up, broker), so the load of a shared machine hits all
alike. Samples/s = samples trained / wall time of the training loop; process start-up, edgeagent's
profiling and link probes, torch's first (shape-inferring, untimed) step and evaluation are left out.
Each figure is the median of ``--repeats`` runs. One table shows every model x set-up x broker with the
ratio and issue 52's target beside it, then edgeagent's stock / tuned Mosquitto ratio.

Beside each ratio, its **bound**: after each peer run, every stage process times its own work of one
step alone (the real activations of that step's micro-batches in, the slowdown emulated, the update
included; the other stages idle), and the bound is the peer's measured step over the shortest step any
pipeline of those stages could take here with free messages and no bubble: the busiest stage's work, or
all stages' CPU over the machine's cores. No schedule and no transport can beat the peer by more; a
target above it is out of reach of this set-up (same split, ``M``, cores), whatever the implementation.

Part 3, ``--hops``: one more edgeagent run per model and broker (equal stages; not counted in part 2),
with ``EDGEAGENT_HOP_TRACE`` set for its processes (``edgeagent.runtime.hoptrace``): median ms per hop
(stage i's activations, gradients, results) of encode, publish, relay, decode and queue, and each
stage's forward and backward step.

How the set-ups differ (by design: this is what a user chooses between):

* Transport: edgeagent sends every activation and gradient through an MQTT broker at QoS 1, so each
  transfer is 4 hops (PUBLISH sender -> broker, PUBACK back, PUBLISH broker -> receiver, PUBACK
  back; the tensor crosses loopback twice, store-and-forward) plus the envelope, the codec and the
  message checks; torch's gloo sends the tensor once over a direct TCP connection between the ranks.
* Broker: the embedded one is amqtt (Python, asyncio) in a process of its own (``BrokerProcess``), a
  fourth process on the same cores; Mosquitto is a C process of its own. Stock
  Mosquitto leaves Nagle's algorithm on, so its small writes (PUBACKs, a payload's tail) can wait for
  the peer's delayed ACK; ``set_tcp_nodelay true`` sends them at once (docs/brokers.md).
* Schedule: edgeagent is asynchronous 1F1B with weight stashing: stage 0 keeps K batches (K = 3,
  the number of stages) in flight across optimizer steps, so the pipeline never drains and every
  batch of 32 is one update (with stale weights, PipeDream's rule). torch's schedules are
  synchronous per step: a step of ``--microbatches`` M micro-batches of 32 (M = 3 by default, the
  same work in flight as edgeagent's K) fills the pipeline, drains it, and makes one update of the
  averaged gradient, so every step pays the fill-and-drain bubble ((n - 1) / (M + n - 1) of the
  time for n equal stages). Both process the same 32-sample tensors per transfer and the same
  number of samples in all.
* Extras edgeagent runs and torch does not: heartbeats, metrics, chain and global weight
  replication (every 50 / 100 batches), the batch timer, and the per-message validation.
* Slowdown emulation is the same in both: after each forward and each backward of the slow stage,
  sleep until the step has taken F times the CPU time it really used (edgeagent's
  ``emulate_slowdown``, which on the last stage times forward and backward as one step; in torch a
  wrapper module with two autograd markers times the backward).

If torch's schedule fails or hangs on gloo/CPU (``--timeout`` per run), the script says so with the
error and compares against a plain synchronous pipeline over direct TCP sockets instead (one process
per stage, GPipe fill-and-drain over M micro-batches per step, forward activations and backward
gradients as raw float32 over the sockets); ``--baseline sockets`` picks that baseline outright.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import multiprocessing as mp
import os
import queue
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._peer import (
    BATCH_SIZE,
    LEARNING_RATE,
    MOMENTUM,
    SEED,
    WEIGHT_DECAY,
    Peer,
    PeerConfig,
    PeerJob,
    PeerRun,
)
from edgeagent.broker import free_port
from edgeagent.broker.mosquitto import MosquittoProcess
from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.data import batches_per_epoch, load_dataset
from edgeagent.ops.logs import setup_logging
from edgeagent.pipeline.schedule import one_f_one_b, simulate
from edgeagent.runtime import hoptrace

# Part 1: six 1024-wide layers and a small head split 2/2/2+head: three equal stages whose cost is
# real matrix work, not per-call overhead.
MODEL_OPTIONS = {"hidden": [1024] * 6}


@dataclass(frozen=True)
class Workload:
    """A model of part 2, the data it trains on and its batches of 32 per run (``--compare-batches``)."""

    model: str
    dataset: str
    batches: int
    label: str
    options: tuple[tuple[str, Any], ...] = ()


WORKLOADS = {
    "mlp": Workload("mlp", "digits", 300, "mlp (6 layers) on digits"),
    "mobilenetv2": Workload(
        "mobilenetv2",
        "synthetic:4096:3x32x32:10",
        90,
        "MobileNetV2 (width 0.5, 21 layers) on synthetic 3x32x32",
    ),
}
EQUAL, SLOW = "equal stages (1,1,1)", "slowdowns 1,1,4"
SETUPS: dict[str, list[float]] = {EQUAL: [1.0, 1.0, 1.0], SLOW: [1.0, 1.0, 4.0]}
BROKERS = {
    "embedded": "embedded (amqtt)",
    "tuned": "Mosquitto, set_tcp_nodelay true",
    "stock": "Mosquitto, stock (Nagle on)",
    "external": "--broker URL",
}
# Issue 52's acceptance: edgeagent / peer samples/s at least this much (MobileNetV2: through any broker).
TARGETS: dict[tuple[str, str, str], float] = {
    ("mlp", EQUAL, "tuned"): 1.0,
    ("mlp", SLOW, "tuned"): 1.3,
    ("mlp", EQUAL, "embedded"): 0.8,
    ("mlp", SLOW, "embedded"): 1.1,
    **{("mobilenetv2", SLOW, b): 1.2 for b in BROKERS},
}
BOUND_LEGEND = (
    "bound: the peer's measured step over the shortest step any pipeline of the same stages could take on "
    "this machine with free messages and no bubble (each stage's work of a step timed alone, the slowdown "
    "included: the busiest stage's, or all stages' CPU over the cores); no ratio can exceed it, and a "
    "target above it is beyond the set-up, not the implementation"
)
STOCK_OVER_TUNED = 0.9  # edgeagent's samples/s through a stock Mosquitto / through a tuned one


# -- part 1: overlap -------------------------------------------------------------------------------


def measure(in_flight: int, *, slowdown: float, batches: int, broker: str | None) -> dict[str, Any]:
    train = TrainConfig(
        model="mlp",
        model_options=MODEL_OPTIONS,
        dataset="synthetic:8192:1024:10",
        batch_size=64,
        epochs=1,
        max_batches=batches,
        in_flight=in_flight,
        learning_rate=0.01,
    )
    config = CentralConfig(train=train, progress=False)
    report = run_demo(config, workers=2, slowdowns=[slowdown] * 3, broker=broker, show_progress=False)
    return {
        "in_flight": report.in_flight,
        "samples_per_second": report.samples_per_second,
        "train_seconds": report.train_seconds,
        "points": report.partitions[-1]["points"],
    }


def overlap(args: argparse.Namespace) -> dict[str, Any]:
    pipelined = measure(args.in_flight, slowdown=args.slowdown, batches=args.batches, broker=args.broker)
    serial = measure(1, slowdown=args.slowdown, batches=args.batches, broker=args.broker)
    ratio = pipelined["samples_per_second"] / serial["samples_per_second"]
    ideal = (
        simulate(one_f_one_b(3, args.batches, 1), [1] * 3, [2] * 3).makespan
        / simulate(one_f_one_b(3, args.batches, 3), [1] * 3, [2] * 3).makespan
    )
    print(
        f"3-device pipeline, mlp 6x1024+head on synthetic 1024-feature data, batch 64, "
        f"slowdowns {args.slowdown:g} everywhere, {args.batches} batches, partition {pipelined['points']}"
    )
    print(f"{'in-flight bound':<28}{'samples/s':>12}{'train s':>10}")
    print(
        f"{'default (' + str(pipelined['in_flight']) + ', pipelined)':<28}"
        f"{pipelined['samples_per_second']:>12.1f}{pipelined['train_seconds']:>10.2f}"
    )
    print(f"{'1 (no pipelining)':<28}{serial['samples_per_second']:>12.1f}{serial['train_seconds']:>10.2f}")
    print(f"overlap ratio: {ratio:.2f}x  (ideal for three equal stages with fill and drain: {ideal:.2f}x)")
    return {"pipelined": pipelined, "serial": serial, "ratio": ratio}


# -- part 2: edgeagent ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EdgeRun:
    samples_per_second: float
    train_seconds: float
    batches: int
    points: list[int]
    final_loss: float


def edgeagent_run(workload: Workload, slowdowns: list[float], *, batches: int, broker: str | None) -> EdgeRun:
    """Train ``workload`` with edgeagent, central + one worker per further stage (uniform split)."""
    data = load_dataset(workload.dataset, seed=SEED)
    per_epoch = batches_per_epoch(data.x_train.shape[0], BATCH_SIZE)
    train = TrainConfig(
        model=workload.model,
        model_options=dict(workload.options),
        dataset=workload.dataset,
        batch_size=BATCH_SIZE,
        epochs=math.ceil(batches / per_epoch),
        max_batches=batches,
        learning_rate=LEARNING_RATE,
        momentum=MOMENTUM,
        weight_decay=WEIGHT_DECAY,
        seed=SEED,
    )
    config = CentralConfig(train=train, progress=False, partition="uniform")
    report = run_demo(
        config, workers=len(slowdowns) - 1, slowdowns=slowdowns, broker=broker, show_progress=False
    )
    tail = [float(t["loss"]) for t in report.timeline[-10:]]
    return EdgeRun(
        samples_per_second=report.samples_per_second,
        train_seconds=report.train_seconds,
        batches=report.batches,
        points=list(report.partitions[0]["points"]),
        final_loss=statistics.fmean(tail) if tail else float("nan"),
    )


def start_brokers(
    stack: contextlib.ExitStack, names: list[str], external: str | None
) -> dict[str, str | None]:
    """Each broker's URL (None: run_demo's own embedded broker, one per run); the Mosquittos are this
    script's own, on free ports, stopped when ``stack`` closes."""
    urls: dict[str, str | None] = {}
    directory = None
    for name in names:
        if name in ("tuned", "stock"):
            directory = directory or stack.enter_context(tempfile.TemporaryDirectory())
            urls[name] = stack.enter_context(MosquittoProcess(Path(directory), nodelay=name == "tuned")).url
        else:
            urls[name] = external if name == "external" else None
    return urls


# -- part 2: the comparison --------------------------------------------------------------------


@dataclass
class Row:
    """One model x set-up x broker: its edgeagent runs and the peer runs they were paired with."""

    model: str
    setup: str
    broker: str
    edgeagent: list[EdgeRun] = field(default_factory=list)
    peer: list[PeerRun] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return median_sps(self.edgeagent) / median_sps(self.peer)

    @property
    def bound(self) -> float:
        """The set-up's ceiling on the ratio (``PeerRun.bound``), a median over the peer's runs."""
        return statistics.median(p.bound for p in self.peer)

    def summary(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "edgeagent_samples_per_second": median_sps(self.edgeagent),
            "peer_samples_per_second": median_sps(self.peer),
            "ratio": self.ratio,
            "bound": self.bound,
            "target": TARGETS.get((self.model, self.setup, self.broker)),
        }


def median_sps(runs: list[EdgeRun] | list[PeerRun]) -> float:
    return statistics.median(r.samples_per_second for r in runs)


def compare_model(
    args: argparse.Namespace, workload: Workload, brokers: dict[str, str | None]
) -> dict[str, Any]:
    """Every set-up through every broker, ``--repeats`` times, interleaved (the load of the shared
    machine hits all alike); each edgeagent run is paired with the peer's run on its split."""
    n = len(next(iter(SETUPS.values())))
    batches = args.compare_batches or workload.batches
    base = PeerConfig(
        num_stages=n,
        baseline=args.baseline,
        schedule=args.schedule,
        microbatches=args.microbatches,
        batches=batches,
        ports=[free_port() for _ in range(max(1, n - 1))],
        timeout=args.timeout,
        model=workload.model,
        dataset=workload.dataset,
        model_options=workload.options,
    )
    rows = {(s, b): Row(workload.model, s, b) for s in SETUPS for b in brokers}
    with Peer(base) as peer:
        for repeat in range(args.repeats):
            for setup, slowdowns in SETUPS.items():
                for broker, url in brokers.items():
                    e = edgeagent_run(workload, slowdowns, batches=batches, broker=url)
                    rows[setup, broker].edgeagent.append(e)
                    # The uniform split balances profiled layer times, so it can differ between runs: the
                    # peer trains on the split of the edgeagent run it is paired with.
                    peer.run(setup, repeat, PeerJob(e.points, slowdowns))
    # Read after the loop: a fall-back to the sockets baseline redoes the runs torch did.
    for row in rows.values():
        row.peer = [peer.runs[row.setup, r, tuple(e.points)] for r, e in enumerate(row.edgeagent)]
    splits = sorted({str(e.points) for row in rows.values() for e in row.edgeagent})
    return {
        "label": workload.label,
        "batches": batches,
        "peer": peer.label,
        "torch_failure": peer.failure,
        "peer_startup_seconds": peer.startup_seconds,
        "splits": splits,
        "rows": list(rows.values()),
    }


def _target(row: Row) -> str:
    want = TARGETS.get((row.model, row.setup, row.broker))
    if want is None:
        return ""
    return f">={want:.1f}x {'ok' if row.ratio >= want else 'MISSED'}"


def stock_over_tuned(rows: list[Row]) -> dict[str, float]:
    """Per set-up: edgeagent's samples/s through a stock Mosquitto / through a tuned one."""
    by = {(row.setup, row.broker): row for row in rows}
    return {
        setup: median_sps(by[setup, "stock"].edgeagent) / median_sps(by[setup, "tuned"].edgeagent)
        for setup in SETUPS
        if (setup, "stock") in by and (setup, "tuned") in by
    }


def print_comparison(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> None:
    n = len(next(iter(SETUPS.values())))
    labels = {r["peer"] for r in results.values()}
    peer = labels.pop() if len(labels) == 1 else "peer"
    print(
        f"\nedgeagent (MQTT, K = {n} in flight) vs {peer}: batch 32, the peer {args.microbatches} "
        f"micro-batches of 32 per step, median of {args.repeats}; ratio = edgeagent / peer samples/s"
    )
    for model, r in results.items():
        print(
            f"  {model}: {r['label']}, {r['batches']} batches per run, splits {', '.join(r['splits'])}; "
            f"{r['peer']} (start-up {r['peer_startup_seconds']:.1f} s, untimed)"
        )
    column = f"{peer.split()[0]} samples/s"  # torch or sockets (or peer, when the models' differ)
    head = f"{'model':<13}{'set-up':<22}{'broker':<33}{'edgeagent samples/s':>20}{column:>18}"
    print(head + f"{'ratio':>9}{'bound':>8}  target (issue 52)")
    for r in results.values():
        for row in r["rows"]:
            print(
                f"{row.model:<13}{row.setup:<22}{BROKERS[row.broker]:<33}{median_sps(row.edgeagent):>20.1f}"
                f"{median_sps(row.peer):>18.1f}{row.ratio:>8.2f}x{row.bound:>7.2f}x  {_target(row)}"
            )
    print(BOUND_LEGEND)
    for model, r in results.items():
        for setup, ratio in stock_over_tuned(r["rows"]).items():
            ok = "ok" if ratio >= STOCK_OVER_TUNED else "MISSED"
            print(
                f"stock / tuned Mosquitto (edgeagent samples/s), {model}, {setup}: {ratio:.2f}x  "
                f"target >={STOCK_OVER_TUNED:.1f}x {ok}"
            )
    print("Training loss at the end (edgeagent: last 10 batches, median of runs; peer: last step):")
    for r in results.values():
        for row in r["rows"]:
            e_loss = statistics.median(e.final_loss for e in row.edgeagent)
            p_loss = statistics.median(p.final_loss for p in row.peer)
            print(f"  {row.model}, {row.setup}, {row.broker}: edgeagent {e_loss:.3f}, peer {p_loss:.3f}")


def compare(args: argparse.Namespace, brokers: dict[str, str | None]) -> dict[str, Any]:
    results = {model: compare_model(args, WORKLOADS[model], brokers) for model in args.models}
    print_comparison(args, results)
    return {
        model: {
            **r,
            "rows": [row.summary() for row in r["rows"]],
            "stock_over_tuned": stock_over_tuned(r["rows"]),
        }
        for model, r in results.items()
    }


# -- part 3: the per-hop cost breakdown -------------------------------------------------------------

HOP_PARTS = ("encode", "publish", "relay", "decode", "queue", "forward", "backward")
HOP_LEGEND = (
    "encode: the sender's thread encodes the message; publish: the sender's thread in the transport's "
    "publish call (it writes to the socket: overlaps relay); relay: handed to the transport -> the "
    "receiver's network thread has the whole payload (socket writes, broker, loopback, the receiver's "
    "socket); decode: size limits, decoding, checks; queue: waiting for the receiver's role thread (busy "
    "with other batches); forward / backward: a stage's compute step, its emulated slowdown included "
    "(the last stage runs forward and backward as one step, shown under backward)"
)


def _traced_child(workload: Workload, batches: int, broker: str | None, results: Any) -> None:
    """A fresh process (``spawn``), so that its central node reads EDGEAGENT_HOP_TRACE at import."""
    setup_logging("WARNING")
    results.put(edgeagent_run(workload, SETUPS[EQUAL], batches=batches, broker=broker))


def traced_run(
    workload: Workload, batches: int, broker: str | None, timeout: float
) -> tuple[EdgeRun, dict[str, dict[str, float]]]:
    """One edgeagent run with every process writing its hop trace; its median ms per hop and part."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as directory:
        proc = ctx.Process(target=_traced_child, args=(workload, batches, broker, results))
        os.environ[hoptrace.ENV] = directory  # inherited by the child and by its workers
        try:
            proc.start()
        finally:
            del os.environ[hoptrace.ENV]
        try:
            run = results.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"the traced run ended without a result (exit code {proc.exitcode})") from None
        finally:
            proc.join(timeout=30)
        return run, hoptrace.breakdown(hoptrace.read(directory))


def hops(args: argparse.Namespace, brokers: dict[str, str | None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model in args.models:
        workload = WORKLOADS[model]
        batches = args.compare_batches or workload.batches
        for broker, url in brokers.items():
            run, table = traced_run(workload, batches, url, timeout=args.timeout + 60 * batches / 100)
            out.setdefault(model, {})[broker] = {"run": asdict(run), "breakdown": table}
            print(
                f"\nper-hop cost, {model} through {BROKERS[broker]}: one traced run, equal stages, {batches} "
                f"batches, split {run.points}, {run.samples_per_second:.1f} samples/s (not used above); "
                "median ms per message or step after the first 20 batches"
            )
            print(f"{'hop / stage':<22}" + "".join(f"{p:>10}" for p in HOP_PARTS))
            for hop, parts in table.items():
                cells = (f"{parts[p]:>10.2f}" if p in parts else f"{'-':>10}" for p in HOP_PARTS)
                print(f"{hop:<22}" + "".join(cells))
    if out:
        print(HOP_LEGEND)
    return out


def _names(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [t.strip() for t in text.split(",") if t.strip()]
        wrong = [t for t in names if t not in choices]
        if wrong or not names:
            raise argparse.ArgumentTypeError(f"{', '.join(wrong) or text!r}: pick from {', '.join(choices)}")
        return names

    return parse


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slowdown", type=float, default=10.0, help="part 1: every device's slowdown")
    parser.add_argument("--batches", type=int, default=90, help="part 1: batches per run")
    parser.add_argument(
        "--broker", default=None, help="an external broker's URL: part 1's, and part 2's 'external'"
    )
    parser.add_argument("--in-flight", type=int, default=0, help="the pipelined bound (default: the default)")
    parser.add_argument("--models", type=_names(tuple(WORKLOADS)), default=list(WORKLOADS), help="part 2")
    parser.add_argument(
        "--brokers",
        type=_names(tuple(BROKERS)),
        default=None,
        help="part 2: of embedded,tuned,stock,external (default: all but external; with --broker: external)",
    )
    parser.add_argument(
        "--compare-batches", type=int, default=0, help="part 2: batches of 32 per run (default: per model)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="part 2: runs per set-up (median)")
    parser.add_argument("--microbatches", type=int, default=3, help="part 2: micro-batches of 32 per step")
    parser.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    parser.add_argument("--baseline", choices=["torch", "sockets"], default="torch")
    parser.add_argument("--timeout", type=float, default=120.0, help="part 2: seconds per peer run")
    parser.add_argument("--skip-overlap", action="store_true")
    parser.add_argument("--skip-compare", action="store_true")
    parser.add_argument("--hops", action="store_true", help="one traced run per model x broker: per-hop ms")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.brokers is None:
        args.brokers = ["external"] if args.broker else ["embedded", "tuned", "stock"]
    if "external" in args.brokers and not args.broker:
        parser.error("--brokers external needs --broker URL")
    setup_logging("WARNING")
    logging.getLogger("edgeagent").setLevel(logging.WARNING)

    out: dict[str, Any] = {}
    started = time.perf_counter()
    if not args.skip_overlap:
        out["overlap"] = overlap(args)
    with contextlib.ExitStack() as stack:
        if not args.skip_compare or args.hops:
            brokers = start_brokers(stack, args.brokers, args.broker)
        if not args.skip_compare:
            out["compare"] = compare(args, brokers)
        if args.hops:
            out["hops"] = hops(args, brokers)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
