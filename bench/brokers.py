"""edgeagent through three brokers beside torch's Schedule1F1B over gloo, in one run.

    python bench/brokers.py [--batches 150] [--repeats 3] [--slowdowns 1,1,1] [--timeout 120]

The same model, split, data and optimizer as part 2 of ``bench/pipeline.py`` (whose functions this
reuses): edgeagent (central + 2 workers) through the embedded amqtt broker, a tuned Mosquitto
(``set_tcp_nodelay true``) and a stock one (Nagle's algorithm on, as Debian's package configures it),
both started here on free ports with their own configuration files (the machine's Mosquitto is not
touched). Each edgeagent run is paired with a torch run on its split. Medians of ``--repeats``; the last
line is the stock/tuned ratio of edgeagent's samples/s, which is the figure for a stock broker.
``bench/pipeline.py`` part 2 runs the same through every broker for both set-ups and both models; this
script is the quick one: one set-up, the MLP.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._peer import PeerConfig, PeerJob, PeerPool
from bench.pipeline import WORKLOADS, edgeagent_run
from edgeagent.broker import free_port
from edgeagent.broker.mosquitto import MosquittoProcess
from edgeagent.ops.logs import setup_logging


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=150, help="batches of 32 per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slowdowns", default="1,1,1", help="per stage, e.g. 1,1,4")
    parser.add_argument("--microbatches", type=int, default=3, help="torch: micro-batches of 32 per step")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per torch run")
    args = parser.parse_args()
    setup_logging("WARNING")
    slowdowns = [float(s) for s in args.slowdowns.split(",")]
    n = len(slowdowns)
    config = PeerConfig(
        num_stages=n,
        baseline="torch",
        schedule="1f1b",
        microbatches=args.microbatches,
        batches=args.batches,
        ports=[free_port() for _ in range(max(1, n - 1))],
        timeout=args.timeout,
    )
    edge: dict[str, list[float]] = {}
    peer: dict[str, list[float]] = {}
    started = time.perf_counter()
    with contextlib.ExitStack() as stack, PeerPool(config) as pool:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        brokers = {
            "embedded amqtt": None,
            "Mosquitto, set_tcp_nodelay true": stack.enter_context(MosquittoProcess(tmp)).url,
            "Mosquitto, stock (Nagle on)": stack.enter_context(MosquittoProcess(tmp, nodelay=False)).url,
        }
        for _ in range(args.repeats):
            for name, url in brokers.items():  # interleaved: the shared machine's load hits all alike
                e = edgeagent_run(WORKLOADS["mlp"], slowdowns, batches=args.batches, broker=url)
                edge.setdefault(name, []).append(e.samples_per_second)
                peer.setdefault(name, []).append(pool.run(PeerJob(e.points, slowdowns)).samples_per_second)
    print(
        f"edgeagent vs torch Schedule1F1B (gloo): mlp on digits, batch 32, slowdowns {args.slowdowns}, "
        f"{args.batches} batches per run, median of {args.repeats}"
    )
    print(f"{'broker':<34}{'edgeagent samples/s':>21}{'torch samples/s':>17}{'ratio':>9}")
    medians = {}
    for name in edge:
        medians[name] = e_sps = statistics.median(edge[name])
        p_sps = statistics.median(peer[name])
        print(f"{name:<34}{e_sps:>21.1f}{p_sps:>17.1f}{e_sps / p_sps:>8.2f}x")
    stock, tuned = medians["Mosquitto, stock (Nagle on)"], medians["Mosquitto, set_tcp_nodelay true"]
    print(f"stock / tuned Mosquitto (edgeagent): {stock / tuned:.2f}x")
    elapsed = time.perf_counter() - started
    print(f"total {elapsed:.0f} s (on a shared, loaded machine: compare the ratios, not the rates)")


if __name__ == "__main__":
    main()
