"""Slow links for real: 2-bit against none when the workers' uplinks are `tc` rate limits, not --link-mbps.

    sudo python bench/real_link.py [--mbps 0.5] [--epochs 4] [--repeat 1]

Each worker runs in a network namespace of its own, joined to a bridge by a veth pair whose namespace end
sends at ``--mbps`` (``tc tbf``: the device's uplink; its downlink is not limited); the central node and
a Mosquitto (listening on the bridge) run in the root namespace. No ``--link-mbps`` anywhere: the link
probes measure the uplinks, and the central node paces the replicas of every worker whose uplink is
below ``replica_pace_mbps`` (``pace``). Arms, alternated: uncompressed; 2-bit activations with 8-bit
gradients; 2-bit with the replicas sent at once (``replica_pace_mbps`` 0: FTPipeHD's way). The default
MLP on digits, central + 2 workers. Samples/s over the whole run and final accuracy per arm, then the
ratios, beside ``bench/compression.py --slow-link`` (the same runs over emulated uplinks: 4.75x, 2.80x
with replicas at once). How the set-ups differ: there every device's uplink, the central node's too, is
emulated in the sender; here only the workers' are limited, by the kernel, and the central node's
activations go at full speed. Only the addresses this script creates (10.234.0.0/24) are used.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.netlab import NetnsLink, add_bridge, add_link, in_netns, remove_bridge, remove_link, shape
from edgeagent.broker import free_port
from edgeagent.broker.mosquitto import MosquittoProcess
from edgeagent.cli.demo import worker_command
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.modes import mode
from edgeagent.roles.central import Central, RunReport

BRIDGE, BRIDGE_IP = "eareal-br", "10.234.0.1"
WORKERS = 2
LINKS = [
    NetnsLink(f"eareal-w{i}", f"eareal{i}h", f"eareal{i}n", f"10.234.0.{10 + i}/24", bridge=BRIDGE)
    for i in range(1, WORKERS + 1)
]
ARMS = {  # name: (compression, replica_pace_mbps)
    "none": ("none", 10.0),
    "2-bit": ("2", 10.0),
    "2-bit, replicas at once": ("2", 0.0),
}
EMULATED = {"2-bit": 4.75, "2-bit, replicas at once": 2.80}  # bench/compression.py --slow-link 3


def build(mbps: float) -> None:
    teardown()
    add_bridge(BRIDGE, f"{BRIDGE_IP}/24")
    for link in LINKS:
        add_link(link)
        shape(link.ns_if, mbps=mbps, ns=link.ns, latency="400ms")


def teardown() -> None:
    for link in LINKS:
        remove_link(link)
    remove_bridge(BRIDGE)


def run(arm: str, epochs: int, url: str, lab_url: str, seq: int) -> RunReport:
    compression, pace = ARMS[arm]
    config = CentralConfig(
        cluster=f"real-link-{seq}",
        broker=url,
        workers=WORKERS,
        progress=False,
        compression=compression,
        replica_pace_mbps=pace,
        train=TrainConfig(epochs=epochs),
    )
    procs = [
        subprocess.Popen(in_netns(link.ns, *worker_command(f"worker-{i}", lab_url, config.cluster, 1.0)))
        for i, link in enumerate(LINKS, start=1)
    ]
    try:
        return Central(config, progress=None, modes=mode).run()
    finally:
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=20)
            if p.poll() is None:
                p.kill()
                p.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mbps", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    results: dict[str, list[RunReport]] = {arm: [] for arm in ARMS}
    build(args.mbps)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            port = free_port()
            lab = f"listener {port} {BRIDGE_IP}\n"
            with MosquittoProcess(Path(tmp), extra=lab) as broker:
                seq = 0
                for _ in range(args.repeat):
                    for arm in ARMS:
                        seq += 1
                        t = time.monotonic()
                        report = run(arm, args.epochs, broker.url, f"mqtt://{BRIDGE_IP}:{port}", seq)
                        results[arm].append(report)
                        uplinks = [f"{8 * lk['bandwidth'] / 1e6:.2f}" for lk in report.links]
                        print(
                            f"  {arm:<24} {report.samples_per_second:7.1f} samples/s  accuracy "
                            f"{100 * report.final_accuracy:5.2f} %  links {uplinks} Mbit/s  "
                            f"({time.monotonic() - t:.0f} s)",
                            flush=True,
                        )
    finally:
        teardown()
    summary(results, args)


def summary(results: dict[str, list[RunReport]], args: argparse.Namespace) -> dict[str, Any]:
    sps = {arm: statistics.median(r.samples_per_second for r in runs) for arm, runs in results.items()}
    acc = {arm: statistics.median(r.final_accuracy for r in runs) for arm, runs in results.items()}
    print(
        f"\nworkers' uplinks limited by tc to {args.mbps:g} Mbit/s, {args.epochs} epochs, median of "
        f"{args.repeat}; {time.strftime('%F')}"
    )
    print(f"{'arm':<26}{'samples/s':>10}{'accuracy':>10}{'vs none':>10}{'emulated':>10}")
    for arm in ARMS:
        ratio = sps[arm] / sps["none"]
        emulated = f"{EMULATED[arm]:.2f}x" if arm in EMULATED else ""
        print(f"{arm:<26}{sps[arm]:10.1f}{100 * acc[arm]:9.2f}%{ratio:9.2f}x{emulated:>10}")
    return {"samples_per_second": sps, "accuracy": acc}


if __name__ == "__main__":
    main()
