"""A worker's peak memory (RSS) while it trains a stage, beside ``python -c "import torch"`` alone.

A 512 MB Pi Zero 2 shares its memory with the OS: what a worker costs beyond torch itself is the figure
edgeagent controls. Each run starts the embedded broker (in this process), two ``edgeagent worker --once``
processes and ``edgeagent central`` (one epoch of digits) as processes, and reads each worker's peak RSS
from ``wait4`` (``ru_maxrss``: that process alone, the kernel's high-water mark, nothing sampled).
``import torch`` is measured the same way, as the median of three processes.

* MLP: the default model (``--model mlp``), the stage a worker of central + 2 workers holds;
* MobileNetV2: ``--model mobilenetv2`` as the shipped central.yaml trains it (``width_mult=0.5``) and at
  its default width, ``--max-batches`` batches (the peak comes with the first batches).

    .venv/bin/python bench/worker_memory.py [--worker-python PATH] [--max-batches 30]

``--worker-python`` runs the workers under another interpreter (e.g. a venv with only
``edgeagent[worker]``, made by bench/wheel_install.py --keep DIR); the central node runs under this one.
The target (issue 50): an MLP worker at most ``import torch`` + 50 MB. Last line: held or MISSED.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgeagent.broker import EmbeddedBroker  # noqa: E402

TARGET_MB = 50.0


def peak_mb(proc: subprocess.Popen[bytes]) -> float:
    """Wait for ``proc``; its own peak RSS in MB (``ru_maxrss`` is in KB on Linux)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, proc.args))} exited {proc.returncode}")  # type: ignore[arg-type]
    return usage.ru_maxrss / 1024


def import_torch_mb(python: str) -> float:
    return statistics.median(peak_mb(subprocess.Popen([python, "-c", "import torch"])) for _ in range(3))


def worker_peaks(
    worker_python: str, model: list[str], *, max_batches: int | None, workdir: Path
) -> tuple[list[float], float]:
    """Each worker's peak RSS (MB) through one run of central + 2 workers, and the run's seconds."""
    broker = EmbeddedBroker().start()
    cluster = "mem" + uuid.uuid4().hex[:8]
    started = time.perf_counter()
    try:
        workers = [
            subprocess.Popen(
                [worker_python, "-m", "edgeagent", "worker", "--device-id", f"worker-{i}",
                 "--broker", broker.url, "--cluster", cluster, "--once"],
                cwd=workdir,
                stdout=subprocess.DEVNULL,
                stderr=(workdir / f"worker-{i}.log").open("wb"),
            )
            for i in (1, 2)
        ]  # fmt: skip
        limit = ["--max-batches", str(max_batches)] if max_batches else []
        central = subprocess.run(
            [sys.executable, "-m", "edgeagent", "central", "--broker", broker.url, "--cluster", cluster,
             "--workers", "2", *model, "--epochs", "1", "--checkpoint", "off", "--report",
             str(workdir / "report.json"), *limit],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )  # fmt: skip
        if central.returncode != 0:
            for w in workers:
                w.kill()
            raise SystemExit(f"central exited {central.returncode}: {central.stderr[-2000:]}")
        peaks = [peak_mb(w) for w in workers]
    finally:
        broker.stop()
    return peaks, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-python", default=sys.executable, help="The workers' interpreter.")
    parser.add_argument("--max-batches", type=int, default=30, help="MobileNetV2 runs: batches to train.")
    args = parser.parse_args()
    torch_mb = import_torch_mb(args.worker_python)
    runs = {
        "MLP (default model, 1 epoch)": (["--model", "mlp"], None),
        "MobileNetV2 width_mult=0.5 (central.yaml)": (
            ["--model", "mobilenetv2", "--model-option", "width_mult=0.5"],
            args.max_batches,
        ),
        "MobileNetV2 (default width)": (["--model", "mobilenetv2"], args.max_batches),
    }
    print(f"workers: {args.worker_python}; peak RSS (ru_maxrss) of each of 2 workers, central + 2 on digits")
    print(f"{'process':52s} {'peak MB':>9s} {'- import torch':>15s} {'ratio':>6s}")
    print(f"{'python -c import torch (median of 3)':52s} {torch_mb:9.1f} {0.0:15.1f} {1.0:6.2f}")
    mlp_peak = 0.0
    with tempfile.TemporaryDirectory(prefix="edgeagent-memory-") as tmp:
        for name, (model, max_batches) in runs.items():
            peaks, seconds = worker_peaks(
                args.worker_python, model, max_batches=max_batches, workdir=Path(tmp)
            )
            peak = max(peaks)
            mlp_peak = mlp_peak or peak
            each = " / ".join(f"{p:.0f}" for p in peaks)
            print(
                f"{'worker, ' + name:52s} {peak:9.1f} {peak - torch_mb:+15.1f} {peak / torch_mb:6.2f}"
                f"   (workers {each} MB; run {seconds:.0f} s)"
            )
    held = mlp_peak - torch_mb <= TARGET_MB
    print(
        f"MLP worker at import torch {mlp_peak - torch_mb:+.1f} MB: target <= +{TARGET_MB:.0f} MB: "
        f"{'held' if held else 'MISSED'}"
    )
    sys.exit(0 if held else 1)


if __name__ == "__main__":
    main()
