"""How long ``edgeagent --help`` (and the help of a few commands) takes, beside ``import torch`` alone.

A Pi's first contact with edgeagent is its help; before issue 50 it imported torch (``cli/predictor.py``),
so it cost at least what ``python -c "import torch"`` costs (seconds on a Pi). Each figure is the median
wall time of ``--runs`` fresh processes, run here one after the other; the target is a ratio under 0.5.

    .venv/bin/python bench/cli_startup.py [--runs 5] [--edgeagent PATH]

Shared machine: the ratio is the figure (a Pi is 10-50x slower in both columns).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET = 0.5
HELPS = (["--help"], ["worker", "--help"], ["predictor", "train", "--help"], ["certs", "--help"])


def median_seconds(cmd: list[str], runs: int) -> float:
    """The median wall time of ``runs`` fresh runs of ``cmd`` (after one run to warm the file cache)."""
    times = []
    for i in range(runs + 1):
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-800:]}")
        if i:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def edgeagent_program(given: str | None) -> str:
    """The ``edgeagent`` script next to this interpreter (the venv's), else on PATH."""
    if given:
        return given
    beside = Path(sys.executable).parent / "edgeagent"
    found = str(beside) if beside.is_file() else shutil.which("edgeagent")
    if found is None:
        raise SystemExit(
            "no edgeagent program: install the package (make .venv/bin/.installed) or give --edgeagent"
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--edgeagent", help="The program to time (default: the venv's edgeagent).")
    parser.add_argument("--python", default=sys.executable, help="The interpreter of `import torch`.")
    args = parser.parse_args()
    program = edgeagent_program(args.edgeagent)
    torch_s = median_seconds([args.python, "-c", "import torch"], args.runs)
    print(f"median of {args.runs} fresh processes each; {program}")
    print(f"{'command':36s} {'seconds':>8s} {'/ import torch':>15s}")
    print(f"{'python -c import torch':36s} {torch_s:8.3f} {1.0:15.2f}")
    ratios = []
    for helps in HELPS:
        seconds = median_seconds([program, *helps], args.runs)
        ratios.append(seconds / torch_s)
        print(f"{'edgeagent ' + ' '.join(helps):36s} {seconds:8.3f} {ratios[-1]:15.2f}")
    held = ratios[0] < TARGET
    verdict = "held" if held else "MISSED"
    print(f"edgeagent --help at {ratios[0]:.2f}x import torch: target < {TARGET}: {verdict}")
    sys.exit(0 if held else 1)


if __name__ == "__main__":
    main()
