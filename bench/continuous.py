"""Continuous learning from pre-trained weights on three devices (FTPipeHD, papers/000 Sec. IV-F, Fig. 8).

    python bench/continuous.py [--pretrain-epochs 5] [--epochs 5] [--json FILE]

The paper's scenario: the MNIST training set is split at random, 90 % for pre-training and 10 % as new
data; three Raspberry Pis continue training the pre-trained model on the new data mixed with old data,
at batch 8 and learning rate 0.00625 (its other settings unchanged). It reports that one Pi alone is
killed for lack of memory (after batch 499), that the training accuracy falls to 43.81 % after the first
100 batches on the new data, and (Fig. 8, a curve) that the accuracy climbs back, epoch after epoch, to
about the pre-trained model's.

Ours, in one run of this script:

1. pre-training: central + 2 workers train the default MLP on 90 % of ``digits28`` (the shipped digits
   upsampled to MNIST's 28x28; MNIST cannot be downloaded here) with the default settings, and save it;
2. continuous learning: the same three devices start from those weights (``--init-weights``) on the
   other 10 % mixed with as many old samples, batch 8, learning rate 0.00625; test accuracy (the same
   held-out test set throughout) after the first 100 batches (a run of 100 batches) and after each epoch
   of a full run, beside the pre-trained model's;
3. memory: the training memory the planner's model (``planner.dp.stage_memory``: weights, the weight
   stash of the batches in flight, gradients, momentum, stored activations) gives one device holding the
   whole model against the largest stage of the three devices' split.

How it differs from the paper: processes on one machine instead of Pis; digits upsampled to 28x28
instead of MNIST (1,437 training samples instead of 60,000, so an "epoch" of the new data is 29 batches
of 8 plus as many of old data, against the paper's 750); our figure is test accuracy, the paper's the
training accuracy; a Pi's memory is not emulated: item 3 is the planner's estimate, not a process
killed by the kernel.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.data import load_dataset
from edgeagent.models import ModelSpec, build_model
from edgeagent.ops.logs import setup_logging
from edgeagent.planner.dp import Link, Problem, stage_memory

DATASET = "digits28"
MODEL = "mlp"
BATCH, RATE = 8, 0.00625  # the paper's continuous-learning settings
NEW_SHARE = 0.10
# papers/000 Sec. IV-F.
PAPER_AFTER_100 = 43.81  # % training accuracy after the first 100 batches on the new data
PAPER_SINGLE_PI = "killed for lack of memory after batch 499"


def split_files(folder: Path, seed: int = 0) -> tuple[str, str, int]:
    """The pre-training set (90 %) and the continuous-learning set (the other 10 % and as many old
    samples), both with the same test set, as ``.npz`` files; and the continuous set's size."""
    data = load_dataset(DATASET, seed=seed)
    x, y = data.x_train.numpy(), data.y_train.numpy()
    x_test, y_test = data.x_test.numpy(), data.y_test.numpy()
    order = np.random.default_rng(seed).permutation(len(y))
    cut = round(len(y) * (1 - NEW_SHARE))
    old, new = order[:cut], order[cut:]
    mixed = np.concatenate([new, np.random.default_rng(seed + 1).choice(old, size=len(new), replace=False)])
    pre, cont = folder / "pretrain.npz", folder / "continuous.npz"
    np.savez(pre, X=x[old], y=y[old], X_test=x_test, y_test=y_test)
    np.savez(cont, X=x[mixed], y=y[mixed], X_test=x_test, y_test=y_test)
    return str(pre), str(cont), len(mixed)


def train(
    dataset: str, *, epochs: int, save: str | None = None, init: str | None = None, **train: Any
) -> Any:
    config = CentralConfig(
        train=TrainConfig(model=MODEL, dataset=dataset, epochs=epochs, init_weights=init, **train),
        progress=False,
        save_model=save,
    )
    return run_demo(config, workers=2, slowdowns=[], broker=None, show_progress=False)


def memory(points: list[int], in_flight: int) -> tuple[float, float]:
    """Training memory (MB) of the whole model on one device, and of the largest stage of ``points``."""
    data = load_dataset(DATASET)
    model = build_model(ModelSpec(MODEL, tuple(data.x_train.shape[1:]), data.num_classes), seed=0)
    params, outputs = [], []
    x = data.x_train[:BATCH]
    for layer in model:
        x = layer(x)
        params.append(float(sum(p.numel() * p.element_size() for p in layer.parameters())))
        outputs.append(float(x.numel() * x.element_size()))

    def need(stages: int, k: int, start: int, end: int) -> float:
        problem = Problem(
            layer_times=tuple(1.0 for _ in outputs),
            output_bytes=tuple(int(b) for b in outputs),
            capacities=tuple(1.0 for _ in range(stages)),
            links=tuple(Link(float("inf")) for _ in range(stages - 1)),
            param_bytes=tuple(int(b) for b in params),
            in_flight=in_flight,
        )
        return stage_memory(problem, k, start, end) / 1e6

    whole = need(1, 0, 0, len(outputs))
    largest = max(need(len(points) - 1, k, points[k], points[k + 1]) for k in range(len(points) - 1))
    return whole, largest


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pretrain-epochs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    setup_logging("WARNING")
    with tempfile.TemporaryDirectory(prefix="bench-continuous-") as tmp:
        folder = Path(tmp)
        pre, cont, samples = split_files(folder)
        weights = str(folder / "pretrained.pt")
        base = train(pre, epochs=args.pretrain_epochs, save=weights)
        per_epoch = -(-samples // BATCH)  # batches in an epoch of new + old data
        first = train(
            cont,
            epochs=-(-100 // per_epoch),
            init=weights,
            batch_size=BATCH,
            learning_rate=RATE,
            max_batches=100,
        )
        full = train(cont, epochs=args.epochs, init=weights, batch_size=BATCH, learning_rate=RATE)
    points = list(full.partitions[0]["points"])
    whole, largest = memory(points, in_flight=len(points) - 1)
    curve = [round(100 * a, 2) for a in full.test_accuracy_per_epoch]
    out = {
        "pretrained_accuracy": round(100 * base.final_accuracy, 2),
        "after_100_batches": round(100 * first.final_accuracy, 2),
        "per_epoch": curve,
        "split": points,
        "memory_one_device_mb": round(whole, 2),
        "memory_largest_stage_mb": round(largest, 2),
    }
    print(
        f"FTPipeHD Sec. IV-F / Fig. 8: continuous learning on 3 devices "
        f"({DATASET}, {MODEL}, batch {BATCH}, lr {RATE})"
    )
    print(
        f"  pre-trained ({args.pretrain_epochs} epochs on 90 %): "
        f"test accuracy {out['pretrained_accuracy']:.2f} %"
    )
    print(
        f"  after the first 100 batches of new + old data: {out['after_100_batches']:.2f} % "
        f"(paper: training accuracy {PAPER_AFTER_100} %)"
    )
    print(
        f"  after each epoch: {', '.join(f'{a:.2f}' for a in curve)} % "
        "(paper: a curve back to the pre-trained level)"
    )
    print(
        f"  memory (planner's model, batch {BATCH}): one device {whole:.2f} MB, "
        f"the largest of 3 stages {largest:.2f} MB "
        f"({whole / largest:.1f}x less; split {points}); paper: one Pi {PAPER_SINGLE_PI}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
