"""The pipeline's staleness and the learning rate: MobileNetV2 at 0.05 against its pipelined rate.

    python bench/staleness.py [--runs 3] [--epochs 5] [--workers 2] [--slowdowns 1,1,10] [--json FILE]

Asynchronous pipelining trains every stage on gradients K - 1 updates old (K batches in flight, one per
stage). MobileNetV2 on digits at TrainConfig's 0.05 gets worse before it gets better: the first epoch's
mean training loss rises above chance's ln 10 = 2.30 and the test accuracy falls back between epochs, so
one run's final accuracy can be far below the next one's. This prints, for every run of three set-ups
(the learning rate 0.05; none set, so the model's pipelined rate, config.PIPELINED_LEARNING_RATES, scaled
by the staleness beyond 4 stages; and 0.05 with one batch in flight, no staleness, at the cost of the
pipelining), the test accuracy after every epoch, the first epoch's training loss, the largest fall of the
test accuracy from one epoch to a later one, and samples/s. No paper gives a figure for this: FTPipeHD
(papers/000) trains at its own rates on other data; the synchronous run is the baseline without staleness.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.ops.logs import setup_logging

CHANCE_LOSS = math.log(10)


def setups() -> dict[str, dict[str, Any]]:
    return {
        "lr 0.05": {"learning_rate": 0.05},
        "pipelined rate": {},
        "lr 0.05, 1 in flight": {"learning_rate": 0.05, "in_flight": 1},
    }


def largest_fall(accuracy: list[float]) -> float:
    """The most the test accuracy fell from one epoch to any later one (0 when it only rose)."""
    best, fall = -1.0, 0.0
    for a in accuracy:
        best = max(best, a)
        fall = max(fall, best - a)
    return fall


def run(settings: dict[str, Any], *, epochs: int, workers: int, slowdowns: list[float]) -> dict[str, Any]:
    train = TrainConfig(model="mobilenetv2", epochs=epochs, **settings)
    config = CentralConfig(train=train, progress=False, workers=workers)
    report = run_demo(config, workers=workers, slowdowns=slowdowns, broker=None, show_progress=False)
    accuracy = list(report.test_accuracy_per_epoch)
    return {
        "learning_rate": report.learning_rate,  # the rate the stages trained at (scaled to the depth)
        "in_flight": report.in_flight,
        "accuracy": accuracy,
        "first_epoch_loss": report.train_loss_per_epoch[0],
        "largest_fall": largest_fall(accuracy),
        "samples_per_second": report.samples_per_second,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slowdowns", default="1,1,10")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    setup_logging("WARNING")
    slowdowns = [float(s) for s in args.slowdowns.split(",")]
    results: dict[str, list[dict[str, Any]]] = {}
    print(
        f"MobileNetV2, digits, {args.epochs} epochs, {args.workers + 1} stages, slowdowns {args.slowdowns}, "
        f"{args.runs} runs each; chance's loss {CHANCE_LOSS:.2f}"
    )
    print(
        f"{'set-up':<22}{'lr':>6}{'K':>3}  {'test accuracy per epoch (%)':<34}"
        f"{'loss 0':>7}{'fall':>7}{'final':>7}{'samples/s':>10}"
    )
    for name, settings in setups().items():
        results[name] = []
        for _ in range(args.runs):
            r = run(settings, epochs=args.epochs, workers=args.workers, slowdowns=slowdowns)
            results[name].append(r)
            per_epoch = " ".join(f"{a:5.1%}"[:-1] for a in r["accuracy"])
            print(
                f"{name:<22}{r['learning_rate']:>6.3g}{r['in_flight']:>3}  {per_epoch:<34}"
                f"{r['first_epoch_loss']:>7.2f}{r['largest_fall']:>7.1%}{r['accuracy'][-1]:>7.1%}"
                f"{r['samples_per_second']:>10.0f}",
                flush=True,
            )
    print("mean over runs:")
    for name, rows in results.items():
        n = len(rows)
        print(
            f"  {name:<22} final {sum(r['accuracy'][-1] for r in rows) / n:6.1%}, worst final "
            f"{min(r['accuracy'][-1] for r in rows):6.1%}, first-epoch loss "
            f"{sum(r['first_epoch_loss'] for r in rows) / n:.2f}, largest fall "
            f"{max(r['largest_fall'] for r in rows):6.1%}, samples/s "
            f"{sum(r['samples_per_second'] for r in rows) / n:.0f}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
