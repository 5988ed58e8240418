"""Fault recovery: FTPipeHD (re-split over the survivors) vs ResPipe (the next worker takes over).

    python bench/recovery.py [--slowdowns 1,2,4] [--kill-at 205] [--epochs 4] [--json FILE]

The paper's scenario (papers/000 Sec. IV-E): heterogeneous devices, the worker with index 1 is killed
with SIGKILL when batch 205 starts its backward pass. For each recovery mode, one run prints the time
per batch around the fault, the recovery overhead (from the last batch before the fault to the first
completed batch after it) with the detection time shown apart, the samples/s and time per epoch
after recovery, and compares with the oracle split of the survivors (a run of the survivors alone).
Targets: overhead after detection <= 2.24 s (the paper's figure), throughput after recovery >= 0.9x
the survivors' oracle, and faster epochs than ResPipe.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.demo import run_demo
from edgeagent.logs import setup_logging
from edgeagent.roles.central import RunReport

DATASET = "synthetic:4096:3x32x32:10"
BATCH = 32


def run(
    slowdowns: list[float],
    *,
    epochs: int,
    recovery: str = "ftpipehd",
    partition: str = "dynamic",
    kills: dict[str, int] | None = None,
) -> RunReport:
    train = TrainConfig(model="mobilenetv2", dataset=DATASET, epochs=epochs, batch_size=BATCH)
    config = CentralConfig(train=train, progress=False, recovery=recovery, partition=partition)
    return run_demo(
        config, workers=len(slowdowns) - 1, slowdowns=slowdowns, broker=None, show_progress=False, kills=kills
    )


def batch_times(report: RunReport) -> dict[int, float]:
    """Completion time of each batch id (its last completion: replayed batches count once, as replayed)."""
    return {int(row["batch"]): float(row["t"]) for row in report.timeline}


def rate_between(times: dict[int, float], first: int, last: int) -> float:
    ids = [b for b in range(first, last + 1) if b in times and b - 1 in times]
    if not ids:
        return 0.0
    return len(ids) * BATCH / sum(times[b] - times[b - 1] for b in ids)


def analyse(report: RunReport, kill_at: int) -> dict[str, Any]:
    (rec,) = report.recoveries
    times = batch_times(report)
    after = [row for row in report.timeline if row["t"] > rec["resumed_at"]]
    first_after = float(after[0]["t"]) if after else float("nan")
    per_epoch = report.batches // max(1, report.epochs)
    fault_epoch = kill_at // per_epoch
    epoch_ends = [times.get((e + 1) * per_epoch - 1) for e in range(report.epochs)]
    after_epochs = [
        epoch_ends[e] - epoch_ends[e - 1]  # type: ignore[operator]
        for e in range(fault_epoch + 1, report.epochs)
        if epoch_ends[e] is not None and epoch_ends[e - 1] is not None
    ]
    resume_batch = rec["rolled_back_to"]
    return {
        "recovery": rec,
        "around": {
            b: times[b] - times[b - 1]
            for b in range(kill_at - 15, kill_at + 16)
            if b in times and b - 1 in times
        },
        "overhead": first_after - rec["last_progress_at"],
        "detection": rec["detected_at"] - rec["last_progress_at"],
        "after_detection": first_after - rec["detected_at"],
        "rate_after": rate_between(times, resume_batch + 20, report.batches - 1),
        "epoch_after": sum(after_epochs) / len(after_epochs) if after_epochs else float("nan"),
        "final_accuracy": report.final_accuracy,
        "points": rec["points"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slowdowns", default="1,2,4", help="central, worker-1 (killed), worker-2")
    parser.add_argument("--kill-at", type=int, default=205)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    setup_logging("WARNING")
    slowdowns = [float(s) for s in args.slowdowns.split(",")]
    kills = {"worker-1": args.kill_at}

    results = {
        mode: analyse(run(slowdowns, epochs=args.epochs, recovery=mode, kills=kills), args.kill_at)
        for mode in ("ftpipehd", "respipe")
    }
    survivors = [slowdowns[0], *slowdowns[2:]]
    oracle = run(survivors, epochs=2, partition="oracle")
    oracle_rate = rate_between(batch_times(oracle), 20, oracle.batches - 1)

    print(
        f"MobileNetV2 on {DATASET}, batch {BATCH}, slowdowns {args.slowdowns}; worker-1 (index 1) killed "
        f"with SIGKILL when batch {args.kill_at} starts its backward pass"
    )
    print("\nseconds per batch around the fault:")
    print(f"{'batch':>6}" + "".join(f"{m:>11}" for m in results))
    for b in range(args.kill_at - 15, args.kill_at + 16):
        cells = [results[m]["around"].get(b) for m in results]
        print(f"{b:>6}" + "".join(f"{c:>11.3f}" if c is not None else f"{'':>11}" for c in cells))
    print(f"\n{'':<34}" + "".join(f"{m:>12}" for m in results))
    rows = [
        ("detection (s)", "detection", "{:.2f}"),
        ("overhead after detection (s)", "after_detection", "{:.2f}"),
        ("overhead, fault to next batch (s)", "overhead", "{:.2f}"),
        ("samples/s after recovery", "rate_after", "{:.1f}"),
        ("seconds per epoch after recovery", "epoch_after", "{:.2f}"),
        ("final accuracy", "final_accuracy", "{:.1%}"),
    ]
    for label, key, fmt in rows:
        print(f"{label:<34}" + "".join(f"{fmt.format(results[m][key]):>12}" for m in results))
    print(f"{'split after recovery':<34}" + "".join(f"{results[m]['points']!s:>12}" for m in results))
    for m in results:
        rec = results[m]["recovery"]
        print(
            f"  {m}: rolled back to batch {rec['rolled_back_to']}, {rec['batches_replayed']} batches replayed"
        )
    ft, rp = results["ftpipehd"], results["respipe"]
    print(f"\nsurvivors' oracle split: {oracle.partitions[-1]['points']}, {oracle_rate:.1f} samples/s")
    print(
        f"targets: overhead after detection {ft['after_detection']:.2f} s (<= 2.24); "
        f"throughput after recovery "
        f"{ft['rate_after'] / oracle_rate:.2f}x the survivors' oracle (>= 0.9); epochs "
        f"{rp['epoch_after'] / ft['epoch_after']:.1f}x faster than respipe (> 1)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"results": results, "oracle_rate": oracle_rate}, indent=2, default=str)
        )


if __name__ == "__main__":
    main()
