"""Hybrid stages with real processes and real brokers: more devices than cut points, exactness against the
unreplicated pipeline, failover inside a stage under a real SIGKILL, joins as replicas.

Which device holds which stage follows the DP over profiled layer times, which vary from run to run: the
tests read the plan from the running central node (``Central.active.state.groups``) rather than assume one.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from edgeagent.cli.demo import LocalWorkers, allowed_for
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.modes.pipeline.central.hybrid_feedback import MEASURE_BATCHES, RETRY_BATCHES
from edgeagent.modes.pipeline.central.run import HybridRun
from edgeagent.roles.central import Central, RunReport
from tests.helpers import LocalCluster

pytestmark = pytest.mark.slow

MLP3 = {"hidden": [128, 64]}  # three layers: two cut points
HEAVY_DATA = "synthetic:640:3x32x32:10"
HEAVY_MODEL = "tests.integration.hybrid_models:heavy_conv"
PI = 10.0  # an emulated Pi: 10x this machine
OnBatch = Callable[[int, "Central", LocalWorkers], None]


def run(
    broker: str,
    *,
    workers: int,
    train: TrainConfig,
    slowdowns: list[float] | None = None,
    on_batch: OnBatch | None = None,
    save: Path | None = None,
    flags: dict[str, tuple[str, ...]] | None = None,
    **central: Any,
) -> RunReport:
    """Central node in this process, workers as processes (each with its extra command-line ``flags``);
    ``on_batch`` runs as batches commit."""
    central.setdefault("restart_window", 0.0)

    def progress(values: dict[str, Any], node: Central, local: LocalWorkers) -> None:
        if on_batch is not None and "batch" in values:
            on_batch(values["batch"], node, local)

    allowed = allowed_for(train.model)  # the heavy user model: the workers must be told they may build it
    return LocalCluster(
        broker,
        workers=workers,
        slowdowns=slowdowns,
        on_progress=progress,
        worker_options={"allowed_models": allowed, "extra": flags},
        train=train,
        save_model=str(save) if save else None,
        **central,
    ).run()


def hybrid_run(node: Central) -> HybridRun:
    assert isinstance(node.active, HybridRun)
    return node.active


def test_more_workers_than_cut_points_train_to_the_end(mosquitto_url: str) -> None:
    """Five workers for a three-layer model (before: "cannot split 3 layers into 6 stages"): the run goes
    hybrid by itself and the report says which stages are replicated. The model's compute sits in one
    convolution with few parameters, so replicating its stage pays off over the measured links too."""
    train = TrainConfig(epochs=1, model=HEAVY_MODEL, dataset=HEAVY_DATA)
    # Pi-like devices (10x slower; the emulated time is slept, not spun): compute outweighs the links.
    report = run(mosquitto_url, workers=5, train=train, slowdowns=[PI] * 5, slowdown=PI)
    assert report.mode == "hybrid"
    assert report.epochs == 1 and report.batches == len(report.timeline) == 15  # 480 samples in batches of 32
    # The plan batch 0 ran: planned again over the measured links before batch 0 if that differs. A later
    # re-split from measured capacities (FTPipeHD's, at batch 10) may follow when the machine is loaded:
    # under CI's other tests one did, so this asserts on the first plan trained, not on the last.
    first = [p for p in report.partitions if p["batch"] == 0][-1]
    assert [g for g in first["groups"] if len(g) > 1], report.partitions
    assert all("groups" in p for p in report.partitions), report.partitions
    assert report.recoveries == [] and report.failovers == []


def kill_a_replica(at: int, *, primary: bool) -> tuple[OnBatch, list[str]]:
    """SIGKILL a member of a replicated stage (its primary, or another) when batch ``at`` commits."""
    killed: list[str] = []

    def on_batch(batch: int, node: Central, local: LocalWorkers) -> None:
        if batch != at or killed:
            return
        groups = hybrid_run(node).state.groups
        stage = next(k for k in groups.replicated if k)  # a worker's (stage 0's primary: the central node)
        victim = groups.members[stage][0 if primary else -1]
        killed.append(victim)
        os.kill(local.procs[victim].pid, signal.SIGKILL)

    return on_batch, killed


def test_replicas_match_the_unreplicated_pipeline_and_a_killed_one_loses_no_update(
    amqtt_url: str, tmp_path: Path
) -> None:
    """Without staleness (in_flight=1) neither the split nor the replicas change the arithmetic (the
    members' gradients of their rows add up to the whole batch's), and a replica that dies mid-run costs
    nothing either: its stage's other devices take its rows with no rollback. The weights end as those of
    the unreplicated pipeline without the fault: no update lost or applied twice."""
    # The compute sits in the second layer (not the central node's): every plan over equal devices
    # replicates its stage, whatever the profiled layer times.
    train = TrainConfig(epochs=2, in_flight=1, staleness="none", model=HEAVY_MODEL, dataset=HEAVY_DATA)
    clean = run(amqtt_url, workers=2, train=train, save=tmp_path / "clean.pt", partition="uniform")
    on_batch, killed = kill_a_replica(20, primary=False)
    faulty = run(
        amqtt_url,
        workers=5,
        train=train,
        save=tmp_path / "faulty.pt",
        mode="hybrid",
        partition="uniform",
        on_batch=on_batch,
        replicate_first=False,  # a worker's stage replicated (stage 0's: test_hybrid_first)
    )
    assert killed
    assert [g for g in faulty.partitions[0]["groups"] if len(g) > 1]  # replicated from batch 0
    (failover,) = faulty.failovers
    assert failover["devices"] == killed and failover["detected"] <= failover["resumed"]
    assert faulty.recoveries == []
    batches = [entry["batch"] for entry in faulty.timeline]
    assert batches == sorted(set(batches)) == list(range(clean.batches))  # nothing replayed
    clean_w = torch.load(tmp_path / "clean.pt", weights_only=True)
    faulty_w = torch.load(tmp_path / "faulty.pt", weights_only=True)
    # Rounding only: the members' sums add the rows in another order, and with momentum 0.9 (the default)
    # that accumulates to ~6e-6 over the run's 90 updates; an update lost or applied twice moves the
    # weights by 1e-3 or more.
    for key in clean_w:
        torch.testing.assert_close(faulty_w[key], clean_w[key], rtol=1e-5, atol=3e-5)


def test_the_primary_of_a_replicated_stage_dies_during_an_evaluation(amqtt_url: str) -> None:
    """Pipelined (K = stages), the primary of a replicated stage killed as the epoch ends (its evaluation
    streams through the pipeline): another member becomes the primary, the survivors evaluate the dead
    device's rows too, and the run goes on without a rollback."""
    train = TrainConfig(epochs=1, model=HEAVY_MODEL, dataset=HEAVY_DATA)
    on_batch, killed = kill_a_replica(14, primary=True)  # batch 14 is the epoch's last
    report = run(
        amqtt_url,
        workers=5,
        train=train,
        mode="hybrid",
        partition="uniform",
        on_batch=on_batch,
        replicate_first=False,  # a worker's stage replicated (stage 0's: test_hybrid_first)
    )
    (failover,) = report.failovers
    assert failover["devices"] == killed
    stage = failover["stages"][0]
    assert killed[0] not in failover["groups"][stage]
    assert report.recoveries == [] and report.epochs == 1 and report.batches == 15


def test_a_stage_with_no_device_left_falls_back_to_the_pipelines_recovery(amqtt_url: str) -> None:
    train = TrainConfig(epochs=2, model_options=MLP3)
    killed: list[str] = []

    def on_batch(batch: int, node: Central, local: LocalWorkers) -> None:
        if batch == 30 and not killed:
            groups = hybrid_run(node).state.groups
            alone = [g[0] for g in groups.members[1:] if len(g) == 1]
            killed.append(alone[-1])
            os.kill(local.procs[alone[-1]].pid, signal.SIGKILL)

    # Two workers, one device per stage (max_replicas=1): every worker's stage dies with it.
    # (partition uniform: the plan over equal devices, links free, so both workers hold a stage.)
    report = run(
        amqtt_url,
        workers=2,
        train=train,
        mode="hybrid",
        max_replicas=1,
        partition="uniform",
        on_batch=on_batch,
    )
    assert killed and report.failovers == []
    (rec,) = report.recoveries
    assert rec["lost"] == killed
    assert report.epochs == 2


# The central node runs 2x slower than the Pi-like workers: the first plan check must never move the
# convolution onto it (stage 0, which only the central node holds here), or the newcomer has no stage worth
# joining. At equal speeds whichever of the two measured slower lost the convolution: a neighbour's load,
# or noise alone (CI, 2026-11-29: "304.3 -> 234.1 ms/batch predicted" moved it to the central node).
@pytest.mark.serial
def test_a_device_that_joins_becomes_a_replica(amqtt_url: str) -> None:
    """A model whose compute sits in one convolution with few parameters: a device that joins helps most
    as a second device on that convolution's stage, and the next re-split puts it there."""
    cluster = f"t{uuid.uuid4().hex[:8]}"
    # Pi-like: compute outweighs the links
    local = LocalWorkers(2, amqtt_url, cluster, [PI, PI], allowed_models=allowed_for(HEAVY_MODEL))
    local.start("worker-1")
    train = TrainConfig(epochs=2, model=HEAVY_MODEL, dataset=HEAVY_DATA)
    config = CentralConfig(
        cluster=cluster,
        broker=amqtt_url,
        workers=1,
        train=train,
        progress=False,
        mode="hybrid",
        slowdown=2 * PI,
        repartition_first=5,
        repartition_every=10,
        # The joiner as a replica of a worker's stage: with stage 0 replicated too, the re-split may give
        # the central node worker-1 as a helper and the joiner the head alone (see test_hybrid_first).
        replicate_first=False,
    )
    from tests.integration.test_faults import run_with_newcomer

    report = run_with_newcomer(amqtt_url, config, local, "worker-2", at=6)
    joined = [p for p in report.partitions if any("worker-2" in g for g in p.get("groups", []))]
    assert joined, report.partitions
    assert any("worker-2" in g and len(g) > 1 for g in joined[0]["groups"]), joined[0]
    assert report.epochs == 2


# Serial: the shares follow measured speeds (as for the joiner above).
@pytest.mark.serial
def test_a_slow_member_of_a_replicated_stage_gets_a_smaller_share(amqtt_url: str) -> None:
    """The first plan takes three equal Pis on the convolution's stage, a third of the rows each; worker-3
    is 10x slower, and the stage waits for it every batch. The first re-split keeps the devices and the
    cuts and gives worker-3 a share in proportion to its measured speed (a plan that only re-shares was
    once dropped as "no change": the stage ran at its slowest member's pace to the end)."""
    train = TrainConfig(epochs=2, model=HEAVY_MODEL, dataset=HEAVY_DATA)
    report = run(
        amqtt_url,
        workers=3,
        train=train,
        slowdowns=[PI, PI, 10 * PI],
        slowdown=2 * PI,
        mode="hybrid",
        repartition_first=5,
        repartition_every=10,
        replicate_first=False,
    )
    first = report.partitions[0]
    assert first["shares"][1] == pytest.approx([1 / 3] * 3), report.partitions
    reshared = [p for p in report.partitions[1:] if p["groups"] == first["groups"]]
    assert reshared, report.partitions
    shares = dict(zip(reshared[0]["groups"][1], reshared[0]["shares"][1], strict=True))
    assert shares["worker-3"] < 0.2 < min(shares["worker-1"], shares["worker-2"]), reshared[0]
    assert report.epochs == 2 and report.recoveries == [] and report.failovers == []


# Serial: whether the DP leaves the slow device out, and takes it back at the others' mean speed, follows
# measured speeds.
@pytest.mark.serial
def test_a_device_left_out_for_its_slowness_is_tried_again_once_it_is_fast(amqtt_url: str) -> None:
    """worker-3 is 40x slower than the other two until batch 100. In the first plan (equal devices) it is
    measured slow and left out; from batch 100 it is as fast as they are, out of the plan, where nothing
    measures it: its old capacity alone would keep it out for ever. ``RETRY_BATCHES`` after it was left
    out the plan takes it at the others' mean speed; a retry while it is still slow is measured and undone
    (the next one waits twice as long); after batch 100 one is kept. (The slowdown change reaches it while
    it is out: a device left out still takes its run's ``Emulate``.)"""
    change = 100
    # Wide layers: compute, not the links, decides the plan, and it takes every device it can use.
    train = TrainConfig(epochs=7, model="mlp", model_options={"hidden": [1024] * 4}, dataset="digits")
    report = run(
        amqtt_url,
        workers=3,
        train=train,
        slowdowns=[1.0, 1.0, 40.0],
        mode="hybrid",
        repartition_first=10,
        repartition_every=10,
        slowdown_changes=[f"worker-3@{change}=1"],
    )

    def holds(p: dict[str, Any]) -> bool:
        return any("worker-3" in g for g in p["groups"])

    plans = [(p["batch"], holds(p)) for p in report.partitions]
    slow = [k for k, (batch, held) in enumerate(plans) if held and batch <= change]
    assert slow, plans  # in the plan while slow: measured
    out = next((batch for batch, held in plans[slow[0] :] if not held), None)
    assert out is not None and out <= change, plans  # and left out before it became fast
    back = [batch for batch, held in plans if held and batch > change]
    assert back and back[0] >= out + RETRY_BATCHES, plans
    # Fast now, it stays: a plan that holds it lasts beyond the measurement that would undo it (a retry
    # while it was slow went back after MEASURE_BATCHES and a few).
    ends = [batch for batch, _ in plans[1:]] + [report.batches]
    held, longest = 0, 0
    for (batch, holds_it), end in zip(plans, ends, strict=True):
        held = held + end - batch if holds_it and batch > change else 0
        longest = max(longest, held)
    assert longest >= 2 * MEASURE_BATCHES, plans
    assert report.epochs == 7 and report.recoveries == [], report.recoveries
