"""What logins and per-device topic rights cost: the same demo run open and secured, side by side.

Runs the demo (central + 2 worker processes, MLP on digits) on the embedded amqtt broker twice per
repeat, alternating: anonymous on loopback (the baseline) and ``--secure`` (mutual TLS; every device
logs in with its own argon2-checked password; every publish, subscription and delivery is checked
against the device's rights, and stage ownership follows the plan). Prints samples/s and wall time of both and
their ratio, plus the cost of one rights check.

Usage: ``python bench/security.py [--repeats N] [--epochs E]``
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.protocol.acl import Grant, PlanTracker, may_publish, may_receive
from edgeagent.protocol.topics import Topics


def run(secure: bool, epochs: int) -> tuple[float, float, float]:
    config = CentralConfig(train=TrainConfig(epochs=epochs), progress=False)
    report = run_demo(config, workers=2, slowdowns=[], broker=None, show_progress=False, secure=secure)
    return report.samples_per_second, report.wall_seconds, report.final_accuracy


def check_cost(n: int = 20000) -> float:
    topics = Topics("bench")
    plans = PlanTracker()
    plans.update("bench", "r", 0, ["central", "w1", "w2"])
    grant = Grant("device", "bench")
    grad, act = topics.gradients(1, "w1"), topics.activations(0, "central")
    started = time.perf_counter()
    for _ in range(n):
        may_publish("w1", grant, grad, plans)
        may_receive("w1", grant, act)
    return (time.perf_counter() - started) / (2 * n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    results: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    for _ in range(args.repeats):
        for secure in (False, True):
            results[secure].append(run(secure, args.epochs))
    print(f"demo, {args.epochs} epochs, median of {args.repeats} alternating runs")
    print(f"{'broker':28} {'samples/s':>10} {'wall s':>8} {'accuracy':>9}")
    med = {}
    for secure, label in ((False, "open (anonymous, loopback)"), (True, "secured (TLS+logins+rights)")):
        sps = statistics.median(r[0] for r in results[secure])
        wall = statistics.median(r[1] for r in results[secure])
        acc = statistics.median(r[2] for r in results[secure])
        med[secure] = (sps, wall)
        print(f"{label:28} {sps:10.1f} {wall:8.2f} {100 * acc:8.1f}%")
    print(f"secured / open throughput: {med[True][0] / med[False][0]:.2f}x")
    print(f"one rights check (publish or receive): {1e6 * check_cost():.1f} us")


if __name__ == "__main__":
    main()
