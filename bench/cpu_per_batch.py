"""CPU time per batch of edgeagent's pipeline and of torch's Schedule1F1B on the same model, split and data.

    python bench/cpu_per_batch.py [--slowdowns 1,1,1] [--batches 4000] [--repeats 2]

On a 2-core machine both sides are bound by CPU, so samples/s follows the CPU each spends per batch.
The figure counts the whole machine's busy time (``/proc/stat``: every process, the broker's included)
over a run: edgeagent's as the difference between a run of ``--batches`` and one of a tenth of them
(start-up, the per-process imports and the final evaluation cancel out), torch's over one run of its
stage processes, started once (as ``bench/pipeline.py`` runs it). The MLP of ``bench/pipeline.py`` on a
synthetic set with no epoch end within the run (no evaluation, no drain), through a tuned Mosquitto of
its own, whose own CPU is printed apart. Utilisation is CPU per batch over (cores x wall per batch).
Run it on a quiet machine: anything else running is counted too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._peer import Peer, PeerConfig, PeerJob
from bench.broker_relay import cpu_seconds
from bench.pipeline import BATCH_SIZE, EdgeRun, Workload, edgeagent_run
from edgeagent.broker import free_port
from edgeagent.broker.mosquitto import MosquittoProcess

TICK = os.sysconf("SC_CLK_TCK")
DATASET = "synthetic:200000:64:10"  # 5,000 batches of 32 per epoch: no epoch end in a run
WORKLOAD = Workload("mlp", DATASET, 0, "mlp (6 layers) on synthetic 64 features")


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (user, nice, system, irq...; not idle or iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICK


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slowdowns", default="1,1,1")
    parser.add_argument("--batches", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    slowdowns = [float(x) for x in args.slowdowns.split(",")]
    cores = os.cpu_count() or 1
    big, small = args.batches, max(1, args.batches // 10)
    edge: list[tuple[float, float, float]] = []  # (ms CPU per batch, broker's, ms wall per batch)
    points: list[int] = []
    with contextlib.ExitStack() as stack:
        directory = stack.enter_context(tempfile.TemporaryDirectory())
        broker = stack.enter_context(MosquittoProcess(Path(directory), nodelay=True))
        assert broker.proc is not None
        for _ in range(args.repeats):
            cpu: dict[int, tuple[float, float]] = {}
            runs: dict[int, EdgeRun] = {}
            for n in (big, small):
                machine, own = busy_seconds(), cpu_seconds(broker.proc.pid)
                runs[n] = edgeagent_run(WORKLOAD, slowdowns, batches=n, broker=broker.url)
                cpu[n] = (busy_seconds() - machine, cpu_seconds(broker.proc.pid) - own)
            done = runs[big].batches - runs[small].batches
            wall = 1e3 * BATCH_SIZE / runs[big].samples_per_second
            machine_ms = 1e3 * (cpu[big][0] - cpu[small][0]) / done
            edge.append((machine_ms, 1e3 * (cpu[big][1] - cpu[small][1]) / done, wall))
            points = runs[big].points
    config = PeerConfig(
        num_stages=len(slowdowns),
        baseline="torch",
        schedule="1f1b",
        microbatches=3,
        batches=big,
        ports=[free_port() for _ in range(len(slowdowns) - 1)],
        timeout=600,
        model="mlp",
        dataset=DATASET,
    )
    peer: list[tuple[float, float]] = []
    with Peer(config) as pool:
        pool.run("warm-up", 0, PeerJob(points, slowdowns))  # its processes start in this one: not counted
        for repeat in range(args.repeats):
            machine = busy_seconds()
            run = pool.run("timed", repeat, PeerJob(points, slowdowns))
            peer.append((1e3 * (busy_seconds() - machine) / big, 1e3 * BATCH_SIZE / run.samples_per_second))
    e_cpu = statistics.median(e[0] for e in edge)
    e_broker = statistics.median(e[1] for e in edge)
    e_wall = statistics.median(e[2] for e in edge)
    p_cpu = statistics.median(p[0] for p in peer)
    p_wall = statistics.median(p[1] for p in peer)
    head = f"{WORKLOAD.label}, slowdowns {args.slowdowns}, split {points}, {cores} cores"
    print(f"{head}, medians of {args.repeats}")
    print(f"{'':34}{'ms CPU/batch':>14}{'ms wall/batch':>15}{'utilisation':>13}")
    print(f"{'edgeagent (tuned Mosquitto)':34}{e_cpu:>14.2f}{e_wall:>15.2f}{e_cpu / (cores * e_wall):>12.0%}")
    print(f"{'  of it the broker':34}{e_broker:>14.2f}")
    print(f"{'torch Schedule1F1B (gloo)':34}{p_cpu:>14.2f}{p_wall:>15.2f}{p_cpu / (cores * p_wall):>12.0%}")
    print(f"edgeagent / torch: CPU per batch {e_cpu / p_cpu:.2f}x, samples/s {p_wall / e_wall:.2f}x")


if __name__ == "__main__":
    main()
