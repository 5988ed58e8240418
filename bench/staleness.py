"""Learning quality: the asynchronous pipeline against synchronous SGD, at the user's rate and momentum.

    python bench/staleness.py [--models mlp,cnn,mobilenetv2] [--depths 3,6,8] [--epochs 10] [--slow 4]
                              [--lr 0.05] [--momentum 0.9] [--lr-schedule cosine] [--seeds 3]
                              [--only METHOD,...] [--json FILE] [--png FILE]

For every model (the default six-layer MLP, ResPipe's CNN, MobileNetV2 width 0.5, all on digits) and every
depth (3, 6 and 8 devices: the central node and 2, 5 or 7 workers, the last one ``--slow`` times slower,
emulated), whole runs of ``edgeagent.cli.demo.run_demo`` (the embedded broker, the workers as local
processes) at the same learning rate, momentum, batch (32), epochs and schedule:

``reference``     no staleness (``--in-flight 1``): synchronous SGD, what one device would compute;
``sync``          the synchronous schedule (``--schedule sync``, one micro-batch per stage, a flush
                  per batch): exact SGD with a bubble, at pipelined speed;
``none``          the asynchronous pipeline with no compensation: FTPipeHD without aggregation
                  (FTPipeHD's Fig. 4, "w/o aggregation");
``aggregate``     FTPipeHD as the paper has it (Fig. 4, "with aggregation");
``predict``, ``nesterov``, ``2bw``   the compensations of the literature (edgeagent.pipeline.staleness);
``lookahead``     ours, the default.

``reference`` and ``lookahead`` run ``--seeds`` seeds (their median is the figure), the others one.
Printed per cell: the final test accuracy after the last epoch (median, and each seed), its difference
to the reference, samples/s and its ratio to plain async (``none``) and to the sync schedule. A PNG
draws test accuracy per epoch per method, one panel per cell. Runs that blew up are kept to the end
(``divergence: warn``) and marked.

What the papers count: FTPipeHD (papers/000 Fig. 4) plots test accuracy per epoch with and without
aggregation on its own models and data (their figure: aggregation converges faster); the literature's
bar is synchronous SGD's accuracy (PipeDream-2BW, Kosson et al., Ajanthan et al.). Differences from
their set-ups: digits (1,437 training images of 8x8) instead of CIFAR/ImageNet/text, a few epochs, one
machine's two cores shared by every device, the slow device's time emulated by sleeping.

``--json FILE`` keeps every run as it finishes and reuses those already there, so an interrupted bench
goes on where it stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.ops.logs import setup_logging

# name -> (TrainConfig settings, seeded: run every seed)
METHODS: dict[str, tuple[dict[str, Any], bool]] = {
    "reference": ({"in_flight": 1, "staleness": "none"}, True),
    "sync": ({"schedule": "sync"}, False),
    "none": ({"staleness": "none"}, False),
    "aggregate": ({"staleness": "aggregate"}, False),
    "predict": ({"staleness": "predict"}, False),
    "nesterov": ({"staleness": "nesterov"}, False),
    "2bw": ({"staleness": "2bw"}, False),
    "lookahead": ({"staleness": "lookahead"}, True),
}
DEFAULT = "lookahead"
MODEL_OPTIONS: dict[str, dict[str, Any]] = {"mobilenetv2": {"width_mult": 0.5}}
COLOURS = {
    "reference": "black",
    "sync": "tab:gray",
    "none": "tab:orange",
    "aggregate": "tab:brown",
    "predict": "tab:olive",
    "nesterov": "tab:purple",
    "2bw": "tab:cyan",
    "lookahead": "tab:red",
}


def model_options(model: str, depth: int) -> dict[str, Any]:
    """The model's options for ``depth`` devices: the default MLP has 6 layers, so 8 devices would leave
    it hybrid (the hybrid DP then keeps it whole on the central node: nothing stale to measure); there
    the same residual MLP with one 128-wide layer per device."""
    if model == "mlp" and depth > 6:
        return {"hidden": [128] * (depth - 1)}
    return dict(MODEL_OPTIONS.get(model, {}))


def _key(model: str, depth: int, method: str, seed: int) -> str:
    return f"{model}/{depth}/{method}/{seed}"


def run_one(model: str, depth: int, method: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    settings, _ = METHODS[method]
    train = TrainConfig(
        model=model,
        model_options=model_options(model, depth),
        epochs=args.epochs,
        learning_rate=args.lr,
        momentum=args.momentum,
        lr_schedule=args.lr_schedule,
        seed=seed,
        divergence="warn",
        **settings,
    )
    workers = depth - 1
    slowdowns = [1.0] * workers + [args.slow]
    config = CentralConfig(train=train, workers=workers, progress=False)
    started = time.perf_counter()
    try:
        report = run_demo(config, workers=workers, slowdowns=slowdowns, broker=None, show_progress=False)
    except Exception as exc:  # a method that cannot run here (the sync schedule of a hybrid run)
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "accuracy": list(report.test_accuracy_per_epoch),
        "train_loss": list(report.train_loss_per_epoch),
        "final": report.final_accuracy,
        "samples_per_second": report.samples_per_second,
        "mode": report.mode,
        "stages": len(report.partitions[-1]["points"]) - 1 if report.partitions else depth,
        "diverged": report.diverged,
        "seconds": round(time.perf_counter() - started, 1),
    }


def run_offline(model: str, depth: int, method: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The same run replayed in this process (edgeagent.pipeline.replay): the same arithmetic as a real run
    of the rules that follow each stage's own delay and of the sync schedule, FTPipeHD's vertical sync at
    1F1B's ideal timing; an even split by layers (a real run's DP gives the slow device fewer), at most one
    stage per layer (no hybrid stages), no samples/s."""
    import torch

    from edgeagent.data import batch_indices, batches_per_epoch, load_dataset
    from edgeagent.models import ModelSpec, num_layers
    from edgeagent.pipeline.divergence import above_chance
    from edgeagent.pipeline.replay import build_stages, replay
    from edgeagent.protocol.options import TrainOptions

    settings, _ = METHODS[method]
    train = TrainConfig(
        model=model,
        model_options=model_options(model, depth),
        epochs=args.epochs,
        learning_rate=args.lr,
        momentum=args.momentum,
        lr_schedule=args.lr_schedule,
        seed=seed,
        **settings,
    )
    data = load_dataset(train.dataset, seed=seed)
    spec = ModelSpec(model, data.in_shape, data.num_classes, tuple(sorted(train.model_options.items())))
    layers = num_layers(spec)
    stages_n = min(depth, layers)
    points = [round(i * layers / stages_n) for i in range(stages_n + 1)]
    per_epoch = batches_per_epoch(data.x_train.shape[0], train.batch_size)
    micro = (train.micro_batches or stages_n) if train.schedule == "sync" else 0
    options = dataclasses.replace(
        TrainOptions.of(train), total_batches=per_epoch * train.epochs, micro_batches=micro
    )
    torch.manual_seed(seed)
    stages = build_stages(spec, options, points, seed=seed, in_flight=train.in_flight)
    accuracy, losses = [], []
    started = time.perf_counter()
    for epoch in range(train.epochs):
        order = batch_indices(data.x_train.shape[0], train.batch_size, epoch=epoch, seed=seed)
        batches = [(data.x_train[i], data.y_train[i]) for i in order]
        # One epoch at a time, so that it can be evaluated: the pipeline drains at each epoch's end, as a
        # real run's does for its evaluation.
        epoch_losses = replay(stages, batches, in_flight=train.in_flight, start=epoch * per_epoch)
        losses.append(sum(epoch_losses) / len(epoch_losses))
        x = data.x_test
        for stage in stages:
            x = stage.evaluate(x)
        accuracy.append(float((x.argmax(1) == data.y_test).float().mean()))
    return {
        "accuracy": accuracy,
        "train_loss": losses,
        "final": accuracy[-1],
        "samples_per_second": float("nan"),
        "mode": "offline",
        "stages": stages_n,
        "diverged": "" if not above_chance(losses[-1], data.num_classes) else "loss above chance's",
        "seconds": round(time.perf_counter() - started, 1),
    }


def _flag(runs: list[dict[str, Any]]) -> str:
    """DIVERGED where a run ended with its training loss above chance's; where one only went there on the
    way (deep pipelines' first epoch), the epochs that did."""
    chance = math.log(10) * 1.1  # pipeline.divergence: above chance's by more than 10 %
    if any(r["train_loss"] and not r["train_loss"][-1] <= chance for r in runs):
        return "  DIVERGED"
    above = sorted({e for r in runs for e, v in enumerate(r["train_loss"]) if not v <= chance})
    return f"  (above chance's loss in epoch {', '.join(map(str, above))})" if above else ""


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarise(results: dict[str, Any], model: str, depth: int, args: argparse.Namespace) -> list[str]:
    """The cell's table: one line per method."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for method, (_, seeded) in METHODS.items():
        seeds = range(args.seeds) if seeded else range(1)
        got = [results.get(_key(model, depth, method, s)) for s in seeds]
        rows[method] = [r for r in got if r and "error" not in r]
    ref = _median([100 * r["final"] for r in rows["reference"]])
    speed = {m: _median([r["samples_per_second"] for r in rs]) for m, rs in rows.items()}
    lines = []
    for method, rs in rows.items():
        if not rs:
            err = results.get(_key(model, depth, method, 0), {}).get("error", "not run")
            lines.append(f"  {method:<11} {err[:100]}")
            continue
        finals = [100 * r["final"] for r in rs]
        med = _median(finals)
        per_seed = "" if len(finals) == 1 else " (" + " ".join(f"{f:.1f}" for f in finals) + ")"
        sps = speed[method]
        vs_async, vs_sync = (
            f"{sps / speed[m]:.2f}x" if math.isfinite(speed[m]) and speed[m] > 0 else "-"
            for m in ("none", "sync")
        )
        flag = _flag(rs)
        mark = " *" if method == DEFAULT else ""
        lines.append(
            f"  {method + mark:<11} {med:6.1f} {med - ref:+6.1f}  {sps:7.0f} {vs_async:>7} {vs_sync:>7}"
            f"{per_seed}{flag}"
        )
    return lines


def plot(results: dict[str, Any], args: argparse.Namespace, models: list[str], depths: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(models), len(depths), figsize=(4.2 * len(depths), 3.2 * len(models)), squeeze=False
    )
    for i, model in enumerate(models):
        for j, depth in enumerate(depths):
            ax = axes[i][j]
            for method in METHODS:
                r = results.get(_key(model, depth, method, 0))
                if not r or "error" in r or not r["accuracy"]:
                    continue
                epochs = range(1, len(r["accuracy"]) + 1)
                width = 2.4 if method in (DEFAULT, "reference") else 1.2
                ax.plot(epochs, [100 * a for a in r["accuracy"]], color=COLOURS[method], linewidth=width)
            ax.set_title(f"{model}, {depth} devices")
            ax.set_ylim(0, 100)
            ax.set_xlabel("epoch")
            ax.set_ylabel("test accuracy (%)")
            ax.grid(alpha=0.3)
    handles = [
        plt.Line2D([], [], color=COLOURS[m], linewidth=2.4 if m in (DEFAULT, "reference") else 1.2)
        for m in METHODS
    ]
    fig.legend(handles, list(METHODS), loc="lower center", ncol=len(METHODS), fontsize=8)
    fig.suptitle(
        f"test accuracy per epoch, lr {args.lr} ({args.lr_schedule}), momentum {args.momentum}, "
        f"one device {args.slow:g}x slower (seed 0)"
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(args.png, dpi=110)
    print(f"plot: {args.png}")


SPEED_METHODS = ("none", DEFAULT, "sync")


def speed(args: argparse.Namespace, models: list[str], depths: list[int]) -> None:
    """``--speed``: samples/s only, the default against plain async and the sync schedule, in alternating
    rounds (one run to the next moves samples/s by 10-20 % on a 2-core machine: medians of ``--repeat``).
    At ``--lr`` 0.005, where none of them diverges: a run's arithmetic does not depend on the rate, a
    diverged run's (NaN, ended early) does."""
    print(
        f"samples/s, {args.epochs} epochs, lr {args.lr} (no run diverges), the last device {args.slow:g}x "
        f"slower, medians of {args.repeat} alternating rounds",
        flush=True,
    )
    for model in models:
        for depth in depths:
            got: dict[str, list[float]] = {m: [] for m in SPEED_METHODS}
            for _ in range(args.repeat):
                for method in SPEED_METHODS:
                    r = run_one(model, depth, method, 0, args)
                    # Every epoch trained (a run the NaN ended early is not a speed); told that an
                    # epoch was above chance's loss is no matter here.
                    if "error" not in r and len(r["accuracy"]) == args.epochs:
                        got[method].append(r["samples_per_second"])
            med = {m: _median(v) for m, v in got.items()}
            rounds = "; ".join(f"{m} " + " ".join(f"{v:.0f}" for v in got[m]) for m in SPEED_METHODS)
            print(
                f"{model}, {depth} devices: {DEFAULT} {med[DEFAULT]:.0f}, none {med['none']:.0f}, sync "
                f"{med['sync']:.0f} samples/s: {med[DEFAULT] / med['none']:.2f}x plain async, "
                f"{med[DEFAULT] / med['sync']:.2f}x the sync schedule ({rounds})",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn,mobilenetv2")
    parser.add_argument("--depths", default="3,6,8")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--slow", type=float, default=4.0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--lr-schedule", choices=["constant", "cosine"], default="cosine")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", help="methods to run, comma-separated (default: all)")
    parser.add_argument(
        "--offline", action="store_true", help="replay the runs in this process (minutes, no samples/s)"
    )
    parser.add_argument("--speed", action="store_true", help="samples/s only (see speed())")
    parser.add_argument("--repeat", type=int, default=3, help="--speed: alternating rounds")
    parser.add_argument("--json", type=Path, default=Path("bench-staleness.json"))
    parser.add_argument("--png", type=Path, default=Path("bench-staleness.png"))
    args = parser.parse_args()
    if not 1 <= args.seeds <= 10:
        parser.error("--seeds must be 1-10")
    setup_logging("WARNING")
    models = args.models.split(",")
    depths = [int(d) for d in args.depths.split(",")]
    only = set(args.only.split(",")) if args.only else set(METHODS)
    if args.speed:
        speed(args, models, depths)
        return
    results: dict[str, Any] = json.loads(args.json.read_text()) if args.json.exists() else {}
    print(
        f"digits, {args.epochs} epochs, batch 32, lr {args.lr} ({args.lr_schedule}), momentum "
        f"{args.momentum}, the last device {args.slow:g}x slower; median of {args.seeds} seeds for "
        f"reference and {DEFAULT}",
        flush=True,
    )
    for model in models:
        for depth in depths:
            for method, (_, seeded) in METHODS.items():
                if method not in only:
                    continue
                for seed in range(args.seeds if seeded else 1):
                    key = _key(model, depth, method, seed)
                    if key in results:
                        continue
                    run = run_offline if args.offline else run_one
                    results[key] = run(model, depth, method, seed, args)
                    r = results[key]
                    what = r.get("error") or (
                        f"{100 * r['final']:.1f} %, {r['samples_per_second']:.0f} samples/s, {r['seconds']} s"
                        + _flag([r])
                    )
                    print(f"    {key}: {what}", flush=True)
                    args.json.write_text(json.dumps(results, indent=1))
            print(
                f"{model}, {depth} devices: method, final accuracy %, vs reference, samples/s, "
                "vs none, vs sync"
            )
            for line in summarise(results, model, depth, args):
                print(line, flush=True)
    plot(results, args, models, depths)


if __name__ == "__main__":
    main()
