"""Pipelining overlap: samples/s of a 3-device pipeline with the in-flight bound at its default and at 1.

    python bench/pipeline.py [--slowdown 10] [--batches 90] [--in-flight K] [--broker URL]

Compute dominates through ``--slowdowns S,S,S`` (each device takes S times its CPU time, sleeping the
difference, so three emulated devices do not fight over two cores). With three equal stages the
ratio approaches 3: stage 0 keeps three batches in flight and every device is busy.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.ops.logs import setup_logging
from edgeagent.pipeline.schedule import one_f_one_b, simulate

# Six 1024-wide layers and a small head split 2/2/2+head: three equal stages whose cost is real
# matrix work, not per-call overhead.
MODEL_OPTIONS = {"hidden": [1024] * 6}


def measure(in_flight: int, *, slowdown: float, batches: int, broker: str | None) -> dict[str, float]:
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slowdown", type=float, default=10.0)
    parser.add_argument("--batches", type=int, default=90)
    parser.add_argument("--broker", default=None, help="default: the embedded broker")
    parser.add_argument("--in-flight", type=int, default=0, help="the pipelined bound (default: the default)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    setup_logging("WARNING")
    logging.getLogger("edgeagent").setLevel(logging.WARNING)

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
    if args.json:
        Path(args.json).write_text(
            json.dumps({"pipelined": pipelined, "serial": serial, "ratio": ratio}, indent=2)
        )


if __name__ == "__main__":
    main()
