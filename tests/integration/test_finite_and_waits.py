"""Issue 49, with real processes on a real broker: values that are not finite are refused in flight, and
no wait of a run is fixed.

* A device that sends NaN once (a gradient, an activation, a replica) costs at most one recovery: the
  message is dropped where it arrives, every weight stays finite, and so do the checkpoints.
* A device that keeps sending NaN ends the run after a bounded number of recoveries, with one line that
  names it.
* A MobileNetV2 stage behind a 0.5 Mbit/s uplink survives a re-split (its replicas alone take minutes).
* A device that beats every 5 s is not taken for dead by a central node that beats every second.
* Evaluation batches outside an evaluation are dropped, not computed and forwarded.

Faults are deterministic: ``--send-nan KIND@BATCH`` fills what a worker sends with NaN at that batch.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from edgeagent.cli.demo import LocalWorkers, run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.errors import TrainingError
from edgeagent.models import layer_output_shapes
from edgeagent.modes import mode
from edgeagent.modes.pipeline.central.run import PipelineRun
from edgeagent.protocol.messages import Activation, EvalResult
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode, encode
from edgeagent.roles.central import Central, latest_checkpoint
from edgeagent.roles.central.checkpoint_file import load_checkpoint
from edgeagent.transport.mqtt import MqttTransport
from tests.helpers import LocalCluster

pytestmark = pytest.mark.slow

HEAVY_DATA = "synthetic:640:3x32x32:10"  # as test_hybrid: one convolution holds the compute
HEAVY_MODEL = "tests.integration.hybrid_models:heavy_conv"


def central_and_workers(
    broker: str,
    *,
    flags: dict[str, tuple[str, ...]] | None = None,
    workers: int = 2,
    slowdowns: list[float] | None = None,
    progress: Any = None,
    **settings: Any,
) -> tuple[Central, LocalWorkers]:
    """A central node (to run in this process) and worker processes with extra ``flags`` each, not started."""
    settings.setdefault("train", TrainConfig(epochs=2))
    settings.setdefault("restart_window", 0.0)  # nobody restarts the workers: recover at once
    model = settings["train"].model
    # A user model (the hybrid test's) is built only by workers whose allow-list names it.
    allowed = [model] if ":" in model or "." in model else []
    cluster = LocalCluster(
        broker,
        workers=workers,
        slowdowns=slowdowns,
        on_progress=None if progress is None else lambda values, _node, _local: progress(values),
        worker_options={"extra": flags, "allowed_models": allowed},
        start=False,
        **settings,
    )
    return cluster.node, cluster.local


def finite(state: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point())


@pytest.mark.parametrize(
    ("kind", "sender"),
    [("gradient", "worker-2"), ("activation", "worker-1"), ("replica", "worker-1")],
)
def test_one_nan_from_one_device_is_dropped_and_every_weight_stays_finite(
    amqtt_url: str, tmp_path: Path, kind: str, sender: str
) -> None:
    # Replication every 20 batches, global every 40 (checkpoints at 40 and 80): the NaN replica of batch 80
    # would be the last checkpoint's.
    saved, checkpoints = tmp_path / "model.pt", tmp_path / "checkpoints"
    at = 80 if kind == "replica" else 20
    central, local = central_and_workers(
        amqtt_url,
        flags={sender: ("--send-nan", f"{kind}@{at}")},
        batch_timeout=3.0,
        chain_every=20,
        global_every=40,
        checkpoint=str(checkpoints),
        save_model=str(saved),
    )
    local.start_all()
    try:
        report = central.run()
    finally:
        local.stop()
    assert report.epochs == 2 and not report.diverged, report.diverged
    assert report.final_accuracy > 0.5, report.test_accuracy_per_epoch
    assert finite(torch.load(saved, weights_only=True))
    checkpoint = latest_checkpoint(checkpoints, central.config.cluster)
    assert checkpoint is not None
    state = load_checkpoint(str(checkpoint))
    assert finite(state["weights"]) and finite(state["momentum"])
    # The poisoned version was never written: the checkpoint before it stands.
    assert state["version"] == (40 if kind == "replica" else 80)
    if kind == "replica":
        assert report.recoveries == []  # a replica is not on the training path: nothing to recover
    else:
        # Dropped, the batch is missing: the batch timer finds it and one recovery replays it.
        (rec,) = report.recoveries
        assert rec["case"] == 1 and rec["batch"] <= at
    # Dropped where it arrived, and told to the central node by whoever dropped it (or counted there).
    assert central.nonfinite[sender] >= 1, dict(central.nonfinite)


def test_a_nan_gradient_sum_in_a_replicated_stage_is_dropped(amqtt_url: str, tmp_path: Path) -> None:
    """Hybrid stages: every worker sends NaN in its gradient sum of batch 5 (which devices share a stage
    follows the plan); the members drop each other's, the update is never whole, the run recovers and
    every weight stays finite."""
    saved = tmp_path / "model.pt"
    workers = [f"worker-{i}" for i in range(1, 6)]
    train = TrainConfig(epochs=2, model=HEAVY_MODEL, dataset=HEAVY_DATA)
    central, local = central_and_workers(
        amqtt_url,
        flags={w: ("--send-nan", "sync@5") for w in workers},
        workers=5,
        train=train,
        mode="hybrid",
        partition="uniform",
        batch_timeout=3.0,
        save_model=str(saved),
    )
    local.start_all()
    try:
        report = central.run()
    finally:
        local.stop()
    assert report.epochs == 2 and not report.diverged, report.diverged
    assert [g for g in report.partitions[0]["groups"] if len(g) > 1], report.partitions  # replicated
    # The stage cannot update batch 5: the batches after it stall, the batch timer finds it, one recovery.
    (rec,) = report.recoveries
    assert rec["case"] == 1 and 5 <= rec["batch"] <= 5 + report.in_flight, rec
    assert finite(torch.load(saved, weights_only=True))
    assert sum(central.nonfinite.values()) >= 1


def test_a_device_that_keeps_sending_nan_ends_the_run_naming_it(amqtt_url: str) -> None:
    central, local = central_and_workers(
        amqtt_url, flags={"worker-2": ("--send-nan", "gradient@15+")}, batch_timeout=3.0
    )
    local.start_all()
    try:
        with pytest.raises(TrainingError) as caught:
            central.run()
    finally:
        local.stop()
    line = str(caught.value)
    assert "\n" not in line
    assert "worker-2 keeps sending values that are not finite" in line, line
    assert "no progress past batch 15 in 3 recoveries" in line, line
    active = central.active
    assert isinstance(active, PipelineRun)
    assert len(active.state.report.recoveries) == 3  # bounded: then the run ends


def test_a_slow_mobilenetv2_stage_survives_a_re_split(amqtt_url: str, cluster: str) -> None:
    """worker-2 (the last stage) sends at 0.5 Mbit/s; worker-1 becomes 8x slower at batch 2, so the plan
    check at batch 10 moves layers. worker-2 then replicates its new stage (weights and momentum, chain
    and global: about 2 MB at a quarter width) before it says "built": longer at 0.5 Mbit/s than the fixed
    floor of the switch's wait (startup_timeout, 20 s here), so only a wait derived from the bytes and
    the measured link lets it finish."""
    config = CentralConfig(
        cluster=cluster,
        train=TrainConfig(
            model="mobilenetv2", model_options={"width_mult": 0.25}, epochs=1, max_batches=14
        ),
        startup_timeout=20.0,
        progress=False,
        estimator="capacity",  # FTPipeHD's measured capacities: the slowdown forces the re-split
        repartition_first=10,
        repartition_every=1000,
        slowdown_changes=["worker-1@2=8"],
    )
    report = run_demo(
        config, workers=2, slowdowns=[], broker=amqtt_url, show_progress=False, links=[0.0, 0.0, 0.5]
    )
    assert report.batches == 14
    assert [p["batch"] for p in report.partitions[1:]] == [10], report.partitions
    assert report.recoveries == []


def test_a_device_with_a_longer_heartbeat_interval_is_not_taken_for_dead(amqtt_url: str) -> None:
    # worker-2 (the last stage) sends the central node nothing but its heartbeats while it trains; the
    # emulated slowdowns make the run last several of its intervals.
    slow_beats = ("--heartbeat-interval", "5")
    central, local = central_and_workers(
        amqtt_url,
        flags={"worker-1": slow_beats, "worker-2": slow_beats},
        slowdowns=[80.0, 80.0],
        train=TrainConfig(epochs=3),
    )
    local.start_all()
    try:
        report = central.run()
    finally:
        local.stop()
    assert report.train_seconds > 10, report.train_seconds  # two of its intervals at least
    assert report.recoveries == []
    assert report.epochs == 3


def test_evaluation_batches_outside_an_evaluation_are_dropped(amqtt_url: str, cluster: str) -> None:
    """Evaluation activations of the run, of the right shape, sent to stage 1 in the middle of an epoch on
    the central node's own topic and in its name (the anonymous test broker lets anyone, so the identity
    checks pass): worker-1 drops them (no evaluation is in progress) instead of computing and forwarding
    them."""
    topics = Topics(cluster)
    forged = range(777_000, 777_040)
    seen: list[tuple[str, int]] = []
    sent = threading.Event()
    spy = MqttTransport(amqtt_url, f"spy-{cluster}")
    rogue = MqttTransport(amqtt_url, f"rogue-{cluster}")
    holder: dict[str, Central] = {}

    def watch(topic: str, payload: bytes) -> None:
        _, msg = decode(payload)
        if isinstance(msg, Activation | EvalResult) and msg.batch_id in forged:
            seen.append((topic, msg.batch_id))

    def progress(values: dict[str, Any]) -> None:
        if values.get("batch") != 10 or sent.is_set():
            return
        active = holder["central"].active
        assert isinstance(active, PipelineRun)
        width = layer_output_shapes(active.state.spec)[active.state.points[1] - 1][1:]
        for batch_id in forged:  # the central node waits meanwhile: batches are in flight at the workers
            msg = Activation(
                run_id=active.state.run_id,
                plan_id=active.state.plan_id,
                stage=0,
                batch_id=batch_id,
                version=0,
                mode="eval",
                x=torch.randn(8, *width),
                y=torch.zeros(8, dtype=torch.int64),
            )
            rogue.publish(topics.activations(0, "central"), encode(msg, sender="central"))
        assert rogue.flush(10)
        sent.set()

    try:
        assert spy.wait_connected(10) and rogue.wait_connected(10)
        spy.subscribe(topics.stage_filter(Family.ACTIVATIONS, 1), watch)
        spy.subscribe(topics.stage_filter(Family.RESULTS, 2), watch)
        config = CentralConfig(cluster=cluster, train=TrainConfig(epochs=2), progress=False)
        central = Central(
            config.model_copy(update={"broker": amqtt_url, "workers": 2}), progress=progress, modes=mode
        )
        holder["central"] = central
        local = LocalWorkers(2, amqtt_url, cluster, [1.0, 1.0]).start_all()
        try:
            report = central.run()
        finally:
            local.stop()
    finally:
        spy.close()
        rogue.close()
    assert sent.is_set()
    assert report.epochs == 2 and report.recoveries == []
    assert seen == [], f"forged evaluation batches went on: {seen[:5]}"
    assert not math.isnan(report.final_accuracy)
