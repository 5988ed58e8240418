"""Hybrid stages (``--mode hybrid``): several devices per pipeline stage, against one device per stage.

    python bench/hybrid.py [--only 1,2,3] [--quick] [--epochs 5] [--slowdowns 1,1,1,4,4] [--kill-at 205]
                           [--after 60] [--victim ID] [--failover-partition uniform]
                           [--pipeline-partition oracle] [--json FILE]

Four scenarios, each a set of whole runs of ``edgeagent.cli.demo.run_demo`` in this process (the
embedded broker, the central node here, the workers as local processes):

1. **More devices than cut points.** Five workers for the three-layer MLP (``hidden=[128, 64]``) on
   digits, 2 epochs, no ``--mode`` (the default, pipeline; asked for by name, the pipeline mode refuses
   more workers than cut points): the central node switches to hybrid stages by itself. Checked: the
   report says ``mode == "hybrid"``, the run trained every batch of every epoch, its final test
   accuracy, and the plan's groups (which stages are held by several devices, which devices idle).

2. **Throughput.** Central + 4 workers at emulated slowdowns 1,1,1,4,4 (central first), MobileNetV2
   (width 0.5) on 4096 synthetic 3x32x32 samples, batch 32 (as ``bench/heterogeneity.py``), 5 epochs of
   102 batches. (a) ``--mode hybrid --partition oracle``: the hybrid DP fed the true slowdowns chooses
   cuts, groups and row shares (once before the links are measured, again over the measured links
   before batch 0) and never re-plans, stage 0 replicated where the DP predicts it faster
   (``replicate_first``, the default); (b) the same with ``max_replicas=1``: the best plan with one
   device per stage (the extra devices may stay idle); (c) the same as (a) with ``replicate_first`` off
   (stage 0 the central node alone). Printed: samples/s over the run and from batch
   20 on (start-up left out), the ratio (a)/(b) (goal >= 1.3x), every plan with its reason, and each
   run's test accuracy and train loss per epoch (a hybrid run that ends well below its twin is flagged:
   throughput that does not train is no gain). Also printed: what the hybrid DP predicts on this
   machine's profile of the model and the run's measured links, for one device per stage, the hybrid
   plan with stage 0 the central node alone and with stage 0 replicated (``replicate_first``), each
   beside the run's measured ms per batch from batch 20 on, and the capacity bound no plan beats
   (the model's work over every device in proportion to its speed, free links): the most any
   replication can gain over the best one-device-per-stage plan.

3. **Failover.** One replica of a replicated stage is killed with SIGKILL when batch 205 starts its
   backward pass there, against today's recovery of the same kill in a one-device-per-stage pipeline.
   The cluster of scenario 2 (MobileNetV2, slowdowns 1,1,1,4,4), 3 epochs of 102 batches cut to
   ``kill_at + after`` = 265 batches (``TrainConfig.max_batches``), so batch 205 is reached.
   (a) ``--mode hybrid --partition uniform`` (``--failover-partition``): the hybrid DP over equal
   devices, never re-planned, so a stage is replicated (over the measured links the DP of scenario 2
   may well replicate nothing, and then there is no replica to kill); the victim is the non-primary
   member with the largest share of a replicated stage in a short probe run's plan (the same settings;
   with ``--failover-partition oracle`` scenario 2's plan when it ran; ``--victim`` overrides), and the
   run is repeated once with a victim from its own plan if its plan came out different.
   (b) ``--mode pipeline --partition oracle`` (``--pipeline-partition``) with the same 4 workers and
   the same kill: today's recovery (FTPipeHD's: roll back to the newest replica, re-split over the
   survivors), from the best one-device-per-stage split.
   Both are timed like ``bench/recovery.py`` on the report's clock (training seconds, evaluation out):
   (a) detection = the last progress before the fault (the last committed batch; the kill is not in
   the report, it follows that commit within about a batch) -> the fault detected (hybrid:
   ``failovers[0]["detected"]``); (b) detection -> resume (hybrid: -> ``failovers[0]["resumed"]``, the
   survivors take the dead member's rows and the next batch commits; pipeline: probe, new split, weight
   moves, commit); the replay (pipeline: resume -> the fault batch done again, ``batches_replayed``
   batches; hybrid: 0 batches, checked on the timeline: no batch id repeats); (c) time lost = the fault
   batch's delay against the pre-fault pace (``edgeagent.ops.report.recovery_times``; the same formula
   for the hybrid failover), also divided by that pace (batches lost: the two plans do not run at the
   same pace). Goal: the hybrid failover loses at least 5x less time.

4. **Throughput where replicated stages pay off** (Asteroid's premise: a stage's compute sits in a
   layer no cut can split). ``bench/hybrid_models.py:one_heavy_layer`` (a full-resolution 3x3
   convolution between a cheap first layer and a cheap head) on 2048 synthetic 3x32x32 samples,
   2 epochs, Pi-like devices: scenario 2's slowdowns times 10 (10,10,10,40,40; the emulated time is
   slept, so compute outweighs the links on this machine, as on Pis). The same (a)/(b)/(c) comparison.

5. **Throughput where replicating stage 0 pays off**: the central node is the slowest device and the
   compute sits in the first layer (``bench/hybrid_models.py:heavy_first_layer``), which no split can
   take off the central node. Slowdowns 4,1,1,1,1 (central first) times 10 (Pi-like), the data set
   and epochs of scenario 4. The same (a)/(b)/(c) comparison: (a) may give stage 0 helpers fed with
   input rows, (c) may not.

What the paper counts (Asteroid, MobiCom 2024): throughput up to 12.2x plain pipeline or data
parallelism and 2.1x the best earlier hybrid planner, for the plan its DP picks; its fault tolerance
re-plans the pipeline around a lost device 14x faster than the baselines' recovery. Ours beside
them: (2) the hybrid plan over the best one-device-per-stage plan of the same DP (``max_replicas=1``),
that is, the gain of replicated stages alone; (3) time lost, today's pipeline recovery / hybrid
failover. Set-up differences: Asteroid ran Jetson/Raspberry Pi clusters over Wi-Fi with real
heterogeneity; ours are processes on one 2-core machine with emulated slowdowns (CPU time scaled by
sleeping), every message through one MQTT broker on loopback (amqtt, in this process), small data
sets and a few epochs. On 2 cores the devices also compete for the CPU, so a plan with more busy
devices gains less than its predicted time says.

``--quick`` is a smoke test (about 4-5 minutes): 1 epoch, a few dozen batches, the kill at batch 55 (after
the first chain replication at 50). The default run takes about 12-15 minutes on the 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.data import batches_per_epoch, load_dataset
from edgeagent.models import ModelSpec, build_model
from edgeagent.ops.logs import setup_logging
from edgeagent.ops.report import recovery_times
from edgeagent.planner.hybrid import Device, HybridProblem, capacity_bound
from edgeagent.planner.hybrid_dp import solve_hybrid
from edgeagent.planner.profiler import profile_layers
from edgeagent.roles.central import RunReport

DATASET = "synthetic:4096:3x32x32:10"  # as bench/heterogeneity.py and bench/recovery.py
BATCH = 32
MLP3 = {"hidden": [128, 64]}  # the three-layer MLP: 64 -> 128 -> 64 -> 10
STEADY_FROM = 20  # batches left out of the steady samples/s (start-up, first messages)
PACE_WINDOW = 20  # batches before the fault whose mean time is the pre-fault pace (as recovery_times)
# Asteroid (MobiCom 2024): throughput over the best earlier hybrid planner / over plain pipeline or
# data parallelism; pipeline recovery against the baselines'.
PAPER_VS_HYBRID = 2.1
PAPER_VS_PLAIN = 12.2
PAPER_RECOVERY = 14.0
GOAL_THROUGHPUT = 1.3
# Scenario 4: the premise of replicated stages (one layer holds the compute; no cut can split it) on
# Pi-like devices (the emulated slowdowns times PI: compute outweighs the links on this machine).
HEAVY_MODEL = "bench.hybrid_models:one_heavy_layer"
HEAVY_DATASET = "synthetic:2048:3x32x32:10"
PI = 10.0
# Scenario 5: the central node the slowest device (4x its workers, times PI) and the compute in the first
# layer, which only helpers on stage 0 can share.
FIRST_MODEL = "bench.hybrid_models:heavy_first_layer"
FIRST_SLOWDOWNS = [4.0, 1.0, 1.0, 1.0, 1.0]
GOAL_LOST = 5.0
ACCURACY_GAP = 0.05  # a hybrid run this far below its one-device-per-stage twin is flagged


def run(
    model: str,
    dataset: str,
    slowdowns: list[float],
    *,
    epochs: int,
    model_options: dict[str, Any] | None = None,
    max_batches: int | None = None,
    kills: dict[str, int | str] | None = None,
    **settings: Any,
) -> RunReport:
    """One demo run; ``settings`` go to :class:`CentralConfig` (mode, partition, max_replicas)."""
    train = TrainConfig(
        model=model,
        model_options=model_options or {},
        dataset=dataset,
        epochs=epochs,
        batch_size=BATCH,
        max_batches=max_batches,
    )
    config = CentralConfig(train=train, progress=False, **settings)
    return run_demo(
        config, workers=len(slowdowns) - 1, slowdowns=slowdowns, broker=None, show_progress=False, kills=kills
    )


def plan_of(report: RunReport, index: int = 0) -> dict[str, Any]:
    """The ``index``-th plan of a run: points, groups (central first), shares (None when the report's
    entry has none: a re-split's entry carries its groups only)."""
    p = report.partitions[index]
    workers = p.get("workers") or report.workers
    groups = p.get("groups") or [["central"], *([w] for w in workers)]
    shares = p.get("shares")
    if groups and shares is None and all(len(g) == 1 for g in groups):
        shares = [[1.0] for _ in groups]
    return {
        "batch": p["batch"],
        "points": list(p["points"]),
        "groups": groups,
        "shares": shares,
        "reason": p.get("reason", ""),
    }


def plan_in_force(report: RunReport, batch: int) -> dict[str, Any]:
    """The plan that ran batch ``batch``: the last one decided at or before it (a plan made again over
    the measured links before batch 0 is at batch 0 too)."""
    index = max(i for i, p in enumerate(report.partitions) if p["batch"] <= batch)
    return plan_of(report, index)


def describe(plan: dict[str, Any], devices: list[str] | None = None) -> str:
    """``[0, 5, 21]: central | worker-1 .4 + worker-2 .4 ...`` and the devices left out."""
    stages = []
    shares = plan["shares"] or [[None] * len(g) for g in plan["groups"]]
    for group, share in zip(plan["groups"], shares, strict=True):
        if len(group) == 1:
            stages.append(group[0])
        else:
            stages.append(
                " + ".join(d if x is None else f"{d} {x:.2f}" for d, x in zip(group, share, strict=True))
            )
    text = f"{plan['points']}: " + " | ".join(stages)
    used = {d for g in plan["groups"] for d in g}
    idle = [d for d in devices or [] if d not in used]
    return text + (f"  (idle: {', '.join(idle)})" if idle else "")


def plans_with_rates(report: RunReport) -> list[dict[str, Any]]:
    """Every plan, with the samples/s of the batches it ran (None: superseded before any batch, e.g. the
    first plan, made again over the measured links before batch 0)."""
    plans = [plan_of(report, i) for i in range(len(report.partitions))]
    for k, plan in enumerate(plans):
        end = plans[k + 1]["batch"] if k + 1 < len(plans) else report.batches
        rows = [r for r in report.timeline if plan["batch"] <= r["batch"] < end]
        span = rows[-1]["t"] - rows[0]["t"] if len(rows) > 1 else 0.0
        plan["samples_per_second"] = (len(rows) - 1) * BATCH / span if span > 0 else None
        plan["batches_run"] = len(rows)
    return plans


def rate_from(report: RunReport, start: int) -> float:
    """Samples/s from batch ``start`` to the end (training seconds, evaluation excluded)."""
    rows = [r for r in report.timeline if r["batch"] >= start]
    if len(rows) < 2 or rows[-1]["t"] <= rows[0]["t"]:
        return report.samples_per_second
    return (len(rows) - 1) * BATCH / (rows[-1]["t"] - rows[0]["t"])


# -- scenario 1 -----------------------------------------------------------------------------------------


def scenario1(epochs: int, workers: int) -> dict[str, Any]:
    started = time.monotonic()
    report = run("mlp", "digits", [1.0] * (workers + 1), epochs=epochs, model_options=MLP3)
    data = load_dataset("digits")
    expected = batches_per_epoch(int(data.x_train.shape[0]), BATCH) * epochs
    ids = [int(r["batch"]) for r in report.timeline]
    plan = plan_of(report, -1)
    return {
        "mode": report.mode,
        "batches": report.batches,
        "expected_batches": expected,
        "epochs_evaluated": len(report.test_accuracy_per_epoch),
        "to_the_end": report.batches == expected
        and ids[-1:] == [expected - 1]
        and len(report.test_accuracy_per_epoch) == epochs,
        "final_accuracy": report.final_accuracy,
        "accuracy_per_epoch": report.test_accuracy_per_epoch,
        "samples_per_second": report.samples_per_second,
        "plans": plans_with_rates(report),
        "replicated": [k for k, g in enumerate(plan["groups"]) if len(g) > 1],
        "workers": [f"worker-{i + 1}" for i in range(workers)],
        "wall_seconds": time.monotonic() - started,
    }


def print_scenario1(r: dict[str, Any], epochs: int) -> None:
    print(
        f"Scenario 1: more devices than cut points: {len(r['workers'])} workers, the 3-layer MLP "
        f"(hidden=[128, 64]) on digits, batch {BATCH}, {epochs} epoch(s), no --mode (the default: pipeline)"
    )
    switched = "switched to hybrid by itself" if r["mode"] == "hybrid" else "NOT hybrid"
    print(f"  report mode: {r['mode']!r} ({switched})")
    print(
        f"  trained to the end: {'yes' if r['to_the_end'] else 'NO'} ({r['batches']} of "
        f"{r['expected_batches']} batches, {r['epochs_evaluated']} of {epochs} epochs evaluated)"
    )
    accs = ", ".join(f"{a:.1%}" for a in r["accuracy_per_epoch"])
    print(
        f"  final test accuracy {r['final_accuracy']:.1%} (per epoch: {accs}); "
        f"{r['samples_per_second']:.0f} samples/s"
    )
    for plan in r["plans"]:
        print(f"  plan from batch {plan['batch']}: {describe(plan, r['workers'])}")
        rate = plan["samples_per_second"]
        ran = (
            f"{plan['batches_run']} batches at {rate:.0f} samples/s"
            if rate
            else "superseded before any batch"
        )
        print(f"      ({plan['reason']}; {ran})")
    replicated = r["replicated"]
    print(
        f"  replicated stages in the final plan: {replicated if replicated else 'none'} "
        "(stage 0 is the central node)"
    )


# -- scenario 2 -----------------------------------------------------------------------------------------


def predicted_plans(
    model: str, dataset: str, slowdowns: list[float], links: list[dict[str, float]]
) -> dict[str, Any]:
    """The hybrid DP's predicted seconds per batch on this machine's profile of the model and the run's
    measured links (as the central node plans: every worker on the slowest link, the central node the
    broker's host): one device per stage, hybrid with stage 0 the central node alone, hybrid with
    stage 0 replicated (``replicate_first``, as the runtime runs it by default), and the capacity
    bound no plan beats (every device busy, free links)."""
    data = load_dataset(dataset)
    built = build_model(ModelSpec(model, data.in_shape, data.num_classes), seed=0)
    sample = data.x_train[:BATCH]
    profile = profile_layers(list(built), sample, runs=5)
    bandwidth = min((lk["bandwidth"] for lk in links), default=float("inf"))
    latency = max((lk["latency"] for lk in links), default=0.0)
    normalises = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in built.modules())
    problem = HybridProblem(
        layer_times=tuple(profile.seconds),
        output_bytes=tuple(profile.output_bytes),
        devices=tuple(
            Device(c, bandwidth=bandwidth, latency=latency) if k else Device(c)
            for k, c in enumerate(slowdowns)
        ),
        param_bytes=tuple(sum(q.numel() * q.element_size() for q in layer.parameters()) for layer in built),
        min_share=min(1.0, 8 / BATCH) if normalises else 0.0,
        input_bytes=sample.numel() * sample.element_size() + BATCH * 8,  # the rows and int64 labels
    )
    result: dict[str, Any] = {"bound": capacity_bound(problem)}
    for name, variant in (
        ("one per stage", replace(problem, max_replicas=1)),
        ("stage 0 alone", problem),
        ("hybrid", replace(problem, replicate_first=True)),
    ):
        plan = solve_hybrid(variant)
        result[name] = {"time": plan.time, "points": list(plan.points), "groups": plan.groups}
    return result


def scenario2(
    slowdowns: list[float],
    epochs: int,
    max_batches: int | None,
    model: str = "mobilenetv2",
    dataset: str = DATASET,
    central_slowdown: float | None = None,
) -> dict[str, Any]:
    extra: dict[str, Any] = {"slowdown": central_slowdown} if central_slowdown is not None else {}
    # The same run three times: the hybrid DP as it is (stage 0 replicated where it pays), restricted to
    # one device per stage, and with stage 0 the central node alone.
    reports = {
        name: run(
            model,
            dataset,
            slowdowns,
            epochs=epochs,
            max_batches=max_batches,
            mode="hybrid",
            partition="oracle",
            max_replicas=replicas,
            replicate_first=first,
            **extra,
        )
        for name, replicas, first in (
            ("hybrid", None, True),
            ("one per stage", 1, False),
            ("stage 0 alone", None, False),
        )
    }
    workers = [f"worker-{i + 1}" for i in range(len(slowdowns) - 1)]
    rows: dict[str, Any] = {}
    for name, r in reports.items():
        rows[name] = {
            "mode": r.mode,
            "samples_per_second": r.samples_per_second,
            "steady_samples_per_second": rate_from(r, STEADY_FROM),
            "batches": r.batches,
            "train_seconds": r.train_seconds,
            "final_accuracy": r.final_accuracy,
            "accuracy_per_epoch": r.test_accuracy_per_epoch,
            "train_loss_per_epoch": r.train_loss_per_epoch,
            "plans": [plan_of(r, i) for i in range(len(r.partitions))],
            "in_force": plan_in_force(r, 0),
            "links": r.links,
            "workers": workers,
        }
    central = central_slowdown if central_slowdown is not None else slowdowns[0]
    rows["predicted"] = predicted_plans(model, dataset, [central, *slowdowns[1:]], reports["hybrid"].links)
    return rows


def print_scenario2(rows: dict[str, Any], slowdowns: str, epochs: int, title: str = "") -> None:
    title = title or f"Scenario 2: throughput, MobileNetV2 (width 0.5) on {DATASET}"
    print(
        f"\n{title}, central + {len(rows['hybrid']['workers'])} workers at slowdowns {slowdowns} "
        f"(central first), batch {BATCH}, {epochs} epoch(s), partition oracle"
    )
    head = f"from b{STEADY_FROM}"
    print(f"{'plan':<30}{'samples/s':>10}{head:>10}{'batches':>9}{'train s':>9}{'final acc':>10}")
    labels = {
        "hybrid": "(a) hybrid",
        "one per stage": "(b) max_replicas=1",
        "stage 0 alone": "(c) --no-replicate-first",
    }
    predicted = rows.get("predicted")
    rows = {name: r for name, r in rows.items() if name in labels}
    print(f"{'':<78}{'ms/batch from b' + str(STEADY_FROM):>22}")
    print(f"{'':<78}{'measured':>11}{'predicted':>11}")
    for name, r in rows.items():
        measured = 1e3 * BATCH / r["steady_samples_per_second"]
        guess = f"{1e3 * predicted[name]['time']:>11.1f}" if predicted and name in predicted else f"{'-':>11}"
        print(
            f"{labels[name]:<30}{r['samples_per_second']:>10.1f}{r['steady_samples_per_second']:>10.1f}"
            f"{r['batches']:>9}{r['train_seconds']:>9.1f}{r['final_accuracy']:>10.1%}{measured:>11.1f}{guess}"
        )
    for name, r in rows.items():
        for plan in r["plans"]:
            print(f"  {labels[name]} plan from batch {plan['batch']}: {describe(plan, r['workers'])}")
            print(f"      ({plan['reason']})")
    for name, r in rows.items():
        accs = ", ".join(f"{a:.1%}" for a in r["accuracy_per_epoch"])
        losses = ", ".join(f"{x:.3f}" for x in r["train_loss_per_epoch"])
        print(f"  {labels[name]} test accuracy per epoch: {accs}; train loss per epoch: {losses}")
    hy, one, alone = rows["hybrid"], rows["one per stage"], rows["stage 0 alone"]
    first = hy["in_force"]["groups"][0]
    if len(first) > 1:
        print(
            f"  (a) ran stage 0 replicated: {' + '.join(first)} (the central node sends its helpers their "
            "input rows); (c) kept stage 0 the central node's alone: "
            f"(a)/(c) = {hy['steady_samples_per_second'] / alone['steady_samples_per_second']:.2f}x "
            f"samples/s from batch {STEADY_FROM} on"
        )
    else:
        print("  (a) kept stage 0 the central node's alone: the DP found no gain in helpers for it")
    if hy["final_accuracy"] < one["final_accuracy"] - ACCURACY_GAP:
        print(
            f"  NOTE: the hybrid run ends {one['final_accuracy'] - hy['final_accuracy']:.1%} below the "
            "one-device-per-stage run: same data, model and epochs; it did not learn as well"
        )
    ratio = hy["samples_per_second"] / one["samples_per_second"]
    steady = hy["steady_samples_per_second"] / one["steady_samples_per_second"]
    print(
        f"hybrid / one device per stage (samples/s) = {ratio:.2f}x over the run, {steady:.2f}x from batch "
        f"{STEADY_FROM} on (goal >= {GOAL_THROUGHPUT}x; Asteroid: {PAPER_VS_HYBRID}x the best earlier "
        f"hybrid planner, up to {PAPER_VS_PLAIN}x plain pipeline / data parallelism)"
    )
    if predicted is not None:
        one_ms = 1e3 * predicted["one per stage"]["time"]
        parts = []
        for name in ("stage 0 alone", "hybrid"):
            p = predicted[name]
            ms = 1e3 * p["time"]
            parts.append(f"{name} {ms:.1f} ms ({one_ms / ms:.2f}x, groups {p['groups']})")
        bound = 1e3 * predicted["bound"]
        print(
            "  predicted by the DP (this machine's profile, the measured links): one per stage "
            f"{one_ms:.1f} ms/batch; {'; '.join(parts)}; no plan beats the capacity bound {bound:.1f} ms "
            f"({one_ms / bound:.2f}x one per stage: every device busy all the time, free links)"
        )
    mine, best = hy["in_force"], one["in_force"]
    if mine["groups"] == best["groups"] and mine["points"] == best["points"]:
        print("  the plans that trained are the same: the hybrid DP found no gain in replicating a stage")
    elif all(len(g) == 1 for g in mine["groups"]):
        print("  the hybrid plan that trained has one device per stage: the DP replicated no stage")


# -- scenario 3 -----------------------------------------------------------------------------------------


def pick_victim(plan: dict[str, Any]) -> str | None:
    """A non-primary member of a replicated stage: the one with the largest share (the most rows to move)."""
    best: tuple[float, str] | None = None
    all_shares = plan["shares"] or [[1.0 / len(g)] * len(g) for g in plan["groups"]]
    for group, shares in zip(plan["groups"], all_shares, strict=True):
        for device, share in list(zip(group, shares, strict=True))[1:]:
            if best is None or share > best[0]:
                best = (share, device)
    return best[1] if best else None


def failover_times(report: RunReport, victim: str) -> dict[str, Any]:
    """The hybrid failover's cost, counted as :func:`recovery_times` counts a recovery."""
    if len(report.failovers) != 1 or report.recoveries:
        raise RuntimeError(
            f"expected one failover and no recovery after killing {victim}; got failovers "
            f"{report.failovers}, recoveries {report.recoveries}"
        )
    (f,) = report.failovers
    if f["devices"] != [victim] or "resumed" not in f:
        raise RuntimeError(f"the failover is not the kill of {victim}, or it never resumed: {f}")
    steps = [(int(r["batch"]), float(r["t"])) for r in report.timeline]
    ids = [b for b, _ in steps]
    before = [(b, t) for b, t in steps if t <= f["detected"]]
    committed, last_progress = before[-1]
    window = before[-1 - min(PACE_WINDOW, len(before) - 1) :]
    pace = (window[-1][1] - window[0][1]) / max(1, len(window) - 1)
    batch = int(f["batch"])
    redone = next(t for b, t in steps if b == batch)
    after = [(b, t) for b, t in steps if b >= batch + STEADY_FROM]
    rate_after = (len(after) - 1) * BATCH / (after[-1][1] - after[0][1]) if len(after) > 1 else None
    return {
        "failover": f,
        "batch": batch,
        "committed": committed,
        "pace": pace,
        "detection": f["detected"] - last_progress,
        "recovery": f["resumed"] - f["detected"],
        "replay": max(0.0, redone - f["resumed"]),
        "replayed": 0,
        "repeated_ids": len(ids) - len(set(ids)),
        "lost": (lost := redone - last_progress - (batch - committed) * pace),
        "lost_batches": lost / pace if pace > 0 else None,
        "rate_after": rate_after,
        "final_accuracy": report.final_accuracy,
    }


def plan_before(report: RunReport) -> dict[str, Any]:
    """The last plan decided before any recovery (as bench/recovery.py's ``split_at``)."""
    plans = [
        i for i, p in enumerate(report.partitions) if not str(p.get("reason", "")).startswith("recovery")
    ]
    return plan_of(report, plans[-1])


def recovery_cost(report: RunReport) -> dict[str, Any]:
    """Today's recovery in the pipeline mode (``edgeagent.ops.report.recovery_times``)."""
    if len(report.recoveries) != 1:
        raise RuntimeError(f"expected one recovery, got {report.recoveries}")
    cost = recovery_times(report.to_dict())
    if cost is None:
        raise RuntimeError(f"the report's recovery lacks its timings: {report.recoveries}")
    (rec,) = report.recoveries
    steps = [(int(r["batch"]), float(r["t"])) for r in report.timeline]
    after = [(b, t) for b, t in steps if t > cost.resumed and b >= cost.batch + STEADY_FROM]
    # replayed ids appear twice; keep the last completion of each
    last = dict(after)
    ids = sorted(last)
    span = last[ids[-1]] - last[ids[0]] if len(ids) > 1 else 0.0
    return {
        "recovery_record": rec,
        "batch": cost.batch,
        "committed": cost.committed,
        "pace": cost.pace,
        "detection": cost.detection,
        "recovery": cost.recovery,
        "replay": cost.replay,
        "replayed": cost.replayed,
        "repeated_ids": len(steps) - len({b for b, _ in steps}),
        "lost": cost.lost,
        "lost_batches": cost.lost / cost.pace if cost.lost is not None and cost.pace else None,
        "rate_after": (len(ids) - 1) * BATCH / span if span > 0 else None,
        "final_accuracy": report.final_accuracy,
        "points_after": rec["points"],
    }


def scenario3(
    slowdowns: list[float],
    kill_at: int,
    after: int,
    epochs: int,
    victim: str | None,
    partitions: tuple[str, str],
    known_plan: dict[str, Any] | None,
) -> dict[str, Any]:
    """``partitions``: the hybrid run's and the pipeline run's; ``known_plan``: the hybrid plan of an
    earlier run with the same settings (None: a short probe run finds it)."""
    settings: dict[str, Any] = {"mode": "hybrid", "partition": partitions[0]}
    stop = kill_at + after
    notes: list[str] = []
    if victim is None:
        if known_plan is None:
            probe = run("mobilenetv2", DATASET, slowdowns, epochs=1, max_batches=3, **settings)
            known_plan = plan_in_force(probe, 0)
            notes.append(f"probe run's plan: {describe(known_plan)}")
        victim = pick_victim(known_plan)
        if victim is None:
            raise RuntimeError(
                f"the hybrid plan replicates no stage, nothing to fail over: {describe(known_plan)} "
                "(try --failover-partition uniform)"
            )
    hybrid = None
    for attempt in range(2):
        kills: dict[str, int | str] = {victim: kill_at}
        report = run(
            "mobilenetv2", DATASET, slowdowns, epochs=epochs, max_batches=stop, kills=kills, **settings
        )
        mine = plan_in_force(report, kill_at)
        if victim in [d for g in mine["groups"] for d in g[1:]]:
            hybrid = report
            break
        notes.append(f"attempt {attempt + 1}: plan {describe(mine)} did not have {victim} as a replica")
        again = pick_victim(mine)
        if again is None:
            break
        victim = again
    if hybrid is None:
        raise RuntimeError("; ".join(notes))
    pipeline = run(
        "mobilenetv2",
        DATASET,
        slowdowns,
        epochs=epochs,
        max_batches=stop,
        kills={victim: kill_at},
        mode="pipeline",
        partition=partitions[1],
    )
    return {
        "victim": victim,
        "partitions": list(partitions),
        "notes": notes,
        "hybrid": {**failover_times(hybrid, victim), "plan_before": plan_in_force(hybrid, kill_at)},
        "pipeline": {**recovery_cost(pipeline), "mode": pipeline.mode, "plan_before": plan_before(pipeline)},
    }


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def print_scenario3(r: dict[str, Any], slowdowns: str, kill_at: int, stop: int) -> None:
    print(
        f"\nScenario 3: failover, central + 4 workers at slowdowns {slowdowns}, MobileNetV2 (width 0.5) on "
        f"{DATASET}, batch {BATCH}, {stop} batches, partition {r['partitions'][0]} (hybrid) and "
        f"{r['partitions'][1]} (pipeline); {r['victim']} killed with SIGKILL when "
        f"batch {kill_at} starts its backward pass"
    )
    for note in r["notes"]:
        print(f"  {note}")
    hy, pl = r["hybrid"], r["pipeline"]
    print(f"  (a) hybrid plan: {describe(hy['plan_before'])}; {r['victim']} is a replica, not the primary")
    print(f"  (b) pipeline plan before the fault: {describe(pl['plan_before'])}; mode {pl['mode']!r}")
    rows = [
        ("s per batch before the fault", "pace", "{:.3f}"),
        ("(a) last progress -> detection (s)", "detection", "{:.2f}"),
        ("(b) detection -> resume (s)", "recovery", "{:.2f}"),
        ("(c) time lost, replay counted (s)", "lost", "{:.2f}"),
        ("    in batches at the pre-fault pace", "lost_batches", "{:.1f}"),
        ("    resume -> fault batch done (s)", "replay", "{:.2f}"),
        ("    batches replayed", "replayed", "{:.0f}"),
        ("    batch ids repeated in the timeline", "repeated_ids", "{:.0f}"),
        ("samples/s after the fault", "rate_after", "{:.1f}"),
        ("final accuracy", "final_accuracy", "{:.1%}"),
    ]
    width = 40
    print(f"\n{'':<{width}}{'hybrid failover':>17}{'pipeline recovery':>19}")
    for label, key, fmt in rows:
        print(f"{label:<{width}}{_cell(hy[key], fmt):>17}{_cell(pl[key], fmt):>19}")
    f = hy["failover"]
    print(
        f"  hybrid: failover at batch {f['batch']}: stage(s) {f['stages']} go on with "
        f"{[f['groups'][k] for k in f['stages']]}, shares {[f['shares'][k] for k in f['stages']]}"
    )
    rec = pl["recovery_record"]
    print(
        f"  pipeline: case {rec['case']}, fault at batch {rec['batch']}, rolled back to batch "
        f"{rec['rolled_back_to']}, {rec['batches_replayed']} batches replayed, new split {rec['points']} on "
        f"{rec['workers']}"
    )
    if hy["lost"] is not None and pl["lost"] is not None:
        ratio = pl["lost"] / hy["lost"] if hy["lost"] > 0 else float("inf")
        text = f"time lost: pipeline recovery / hybrid failover = {ratio:.1f}x in seconds"
        if hy["lost_batches"] and pl["lost_batches"] is not None:
            text += f", {pl['lost_batches'] / hy['lost_batches']:.1f}x in batches at each run's own pace"
        print(
            f"{text} (goal >= {GOAL_LOST:.0f}x; Asteroid: pipeline recovery {PAPER_RECOVERY:.0f}x faster "
            "than the baselines')"
        )


# -- main -----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="1,2,3,4,5", help="scenarios to run, e.g. 2 or 1,3")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 epoch, few batches, kill at 55")
    parser.add_argument("--epochs", type=int, default=None, help="scenario 2 (default 5; --quick 1)")
    parser.add_argument("--epochs-mlp", type=int, default=2, help="scenario 1")
    parser.add_argument("--workers-mlp", type=int, default=5, help="scenario 1")
    parser.add_argument("--slowdowns", default="1,1,1,4,4", help="scenarios 2 and 3, central first")
    parser.add_argument("--kill-at", type=int, default=None, help="scenario 3 (default 205; --quick 55)")
    parser.add_argument("--after", type=int, default=None, help="batches after the kill (default 60)")
    parser.add_argument(
        "--victim", default=None, help="scenario 3: the worker to kill (default: from the plan)"
    )
    parser.add_argument(
        "--failover-partition",
        default="uniform",
        choices=["uniform", "oracle", "dynamic"],
        help="scenario 3, the hybrid run (uniform: the plan over equal devices, which replicates a stage)",
    )
    parser.add_argument(
        "--pipeline-partition",
        default="oracle",
        choices=["uniform", "oracle", "dynamic"],
        help="scenario 3, the pipeline run",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    if not only or only - {"1", "2", "3", "4", "5"}:
        parser.error(f"--only takes a subset of 1,2,3,4,5, got {args.only!r}")
    setup_logging("WARNING")
    slowdowns = [float(s) for s in args.slowdowns.split(",")]
    epochs = args.epochs or (1 if args.quick else 5)
    epochs_mlp = 1 if args.quick else args.epochs_mlp
    kill_at = args.kill_at if args.kill_at is not None else (55 if args.quick else 205)
    after = args.after if args.after is not None else (15 if args.quick else 60)
    max_batches = 40 if args.quick else None
    per_epoch = batches_per_epoch(int(load_dataset(DATASET).x_train.shape[0]), BATCH)
    epochs3 = -(-(kill_at + after) // per_epoch)  # enough epochs to reach kill_at + after

    results: dict[str, Any] = {}
    started = time.monotonic()
    if "1" in only:
        results["scenario1"] = scenario1(epochs_mlp, args.workers_mlp)
        print_scenario1(results["scenario1"], epochs_mlp)
    if "2" in only:
        results["scenario2"] = scenario2(slowdowns, epochs, max_batches)
        print_scenario2(results["scenario2"], args.slowdowns, epochs)
    if "3" in only:
        partitions = (args.failover_partition, args.pipeline_partition)
        known = None
        if "scenario2" in results and args.failover_partition == "oracle":
            known = results["scenario2"]["hybrid"]["in_force"]  # the same settings, the same plan
        results["scenario3"] = scenario3(slowdowns, kill_at, after, epochs3, args.victim, partitions, known)
        print_scenario3(results["scenario3"], args.slowdowns, kill_at, kill_at + after)
    def heavy(name: str, factors: list[float], model: str, title: str) -> None:
        """Scenario 2's throughput runs at ``factors`` x a Pi's slowdown on HEAVY_DATASET."""
        pi = [PI * x for x in factors]
        epochs = 1 if args.quick else 2
        results[name] = scenario2(pi, epochs, max_batches, model, HEAVY_DATASET, pi[0])
        print_scenario2(results[name], ",".join(f"{x:g}" for x in pi), epochs, f"{title} on {HEAVY_DATASET}")

    if "4" in only:
        heavy(
            "scenario4", slowdowns, HEAVY_MODEL,
            f"Scenario 4: throughput, one layer holds the compute ({HEAVY_MODEL})",
        )  # fmt: skip
    if "5" in only:
        heavy(
            "scenario5", FIRST_SLOWDOWNS, FIRST_MODEL,
            f"Scenario 5: throughput, the slowest central node holds the heavy first layer ({FIRST_MODEL})",
        )  # fmt: skip
    print(f"\n(wall time {time.monotonic() - started:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
