"""AccEPT Fig. 12: a simple CNN on three small devices, 0.25 to 4 Mbit/s: AccEPT, its parts, FTPipeHD.

    sudo .venv/bin/python bench/accept_fig12.py [--links 0.25,0.5,1,2,4,16,64] [--epochs 1] [--max-batches N]
                                                [--cpu 50,50] [--json FILE]          (root: cgroup v1 quotas)

The paper (papers/004 Sec. 4.3, Fig. 12) trains a simple CNN on three Raspberry Pis, two limited to 2 cores
with ``taskset`` and one with 4, over a phone's WLAN shaped by ``tc`` from 0.25 to 4 Mbit/s, and compares
the training time of four schemes: FTPipeHD, the bit-level compression alone (BLC), the latency predictor
alone (LP) and both (AccEPT). Its figure's bars did not survive the text; its prose says: AccEPT is
"significantly" faster than FTPipeHD at every bandwidth; at low bandwidth the transfers dominate, so the
compression contributes more than the predictor; as the bandwidth grows, LP alone becomes faster than
BLC alone; and with the CNN's small activations the compression's benefit shrinks as the bandwidth grows.

Ours: edgeagent's ``cnn`` (the ResPipe CNN, C8 M2 C16 M2 C32 M2 F128 F10, one conv or pool per layer) on
digits (8x8), batch 32, the central node (unlimited, 1 thread: the 4-core Pi) and two workers under a CFS
quota of ``--cpu`` percent of a core each (default 50: half the central node's speed, the 2-core Pis),
every uplink shaped to the same rate (``links=[rate] * 3``): the paper's 0.25-4 Mbit/s, and 16 and 64,
where our far smaller activations (8x8 digits) and faster devices let compute dominate as the paper's
did within its range. The four arms per rate: FTPipeHD (``--estimator capacity``, no compression), BLC
(capacity, ``--compression 2``: 2-bit activations, 8-bit gradients, AccEPT's fixed scheme), LP
(``--estimator predictor``, no compression) and AccEPT (predictor, ``--compression 2``). The predictor
needs weights pre-trained for this model (``edgeagent predictor collect --model cnn --set
training-short`` then ``train``: one ships, trained on the development VM); without them the LP and
AccEPT arms would plan with FTPipeHD's estimate, so they are left out and the script says so. Figure:
samples/s over the run (training time, evaluation out) and each arm's speed-up over FTPipeHD at the same
rate (the paper's time ratio is the same quantity for the same work).

Set-up differences: the paper's devices are Pis with cores of their own, a real WLAN and MNIST (28x28);
ours are processes on one 2-core machine, links emulated by the sender (``--link-mbps``), digits (8x8:
activations of 4-64 kB per batch of 32 at the CNN's cuts) and runs of ``--epochs`` (the paper: whole
trainings, in minutes).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.errors import EdgeAgentError
from edgeagent.models import ModelSpec
from edgeagent.ops.cgroups import cgroup_problem
from edgeagent.ops.logs import setup_logging
from edgeagent.predictor.store import shipped_path
from edgeagent.roles.central import RunReport

MODEL, DATASET, BATCH = "cnn", "digits", 32
SPEC = ModelSpec(MODEL, (1, 8, 8), 10)
ARMS = {  # name: (estimator, compression)
    "FTPipeHD": ("capacity", "none"),
    "BLC": ("capacity", "2"),
    "LP": ("predictor", "none"),
    "AccEPT": ("predictor", "2"),
}
PAPER = (
    "paper (Fig. 12b, prose): AccEPT well ahead of FTPipeHD at every rate; at low rates BLC ahead of LP, "
    "at high rates LP ahead of BLC; BLC's gain shrinking as the rate grows"
)


def run(estimator: str, compression: str, link: float, args: argparse.Namespace) -> RunReport | str:
    """One whole run, or why it failed (the bench goes on)."""
    config = CentralConfig(
        train=TrainConfig(
            model=MODEL, dataset=DATASET, batch_size=BATCH, epochs=args.epochs, max_batches=args.max_batches
        ),
        progress=False,
        estimator=estimator,
        compression=compression,
    )
    try:
        return run_demo(
            config,
            workers=2,
            slowdowns=[],
            broker=None,
            show_progress=False,
            links=[link] * 3,
            worker_cpu=list(args.cpu),
            worker_threads=[1, 1],
        )
    except EdgeAgentError as exc:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--links", default="0.25,0.5,1,2,4,16,64", help="Mbit/s of every uplink, comma-separated"
    )
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-batches", type=int, default=None, help="cut every run (smoke tests)")
    parser.add_argument("--cpu", default="50,50", help="percent of a core per worker (the 2-core Pis)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    args.cpu = [float(c) for c in args.cpu.split(",")]
    links = [float(x) for x in args.links.split(",")]
    setup_logging("WARNING")
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    problem = cgroup_problem()
    if problem is not None:
        raise SystemExit(f"the workers' CPU quotas need cgroup v1 and root; missing here: {problem}")
    arms = dict(ARMS)
    if not shipped_path(SPEC).exists():
        print(
            f"NOTE: no predictor for {MODEL} ({shipped_path(SPEC).name}): LP and AccEPT would plan "
            "with FTPipeHD's estimate, so only FTPipeHD and BLC run (`edgeagent predictor collect "
            f"--model {MODEL}` then `edgeagent predictor train` make one)"
        )
        arms = {k: v for k, v in arms.items() if v[0] == "capacity"}
    print(
        f"{MODEL} on {DATASET}, batch {BATCH}, central unlimited + 2 workers at {args.cpu} % of a core, "
        f"{args.epochs} epoch(s){f', {args.max_batches} batches' if args.max_batches else ''}"
    )
    print(f"{'Mbit/s':>7}" + "".join(f"{name:>12}" for name in arms) + "   speed-up over FTPipeHD")
    results: dict[str, Any] = {}
    for link in links:
        row = {name: run(est, comp, link, args) for name, (est, comp) in arms.items()}
        base = row["FTPipeHD"]
        cells, ups = [], []
        for name, r in row.items():
            cells.append(f"{r.samples_per_second:>12.1f}" if isinstance(r, RunReport) else f"{'FAILED':>12}")
            if name != "FTPipeHD" and isinstance(r, RunReport) and isinstance(base, RunReport):
                ups.append(f"{name} {r.samples_per_second / base.samples_per_second:.2f}x")
        print(f"{link:>7g}" + "".join(cells) + "   " + ", ".join(ups), flush=True)
        results[str(link)] = {
            name: (
                {
                    "samples_per_second": r.samples_per_second,
                    "final_accuracy": r.final_accuracy,
                    "partitions": [p["points"] for p in r.partitions],
                }
                if isinstance(r, RunReport)
                else {"failed": r}
            )
            for name, r in row.items()
        }
    print(PAPER)
    print("samples/s over the run (training time, evaluation out); speed-up = arm / FTPipeHD at that rate")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
