"""Split-federated training (``--mode split-federated``, PiPar) with real processes and a real broker.

Two workers, each with its own shard of the digits training set (``--dataset``); the central node keeps
only the test set. With no BatchNorm or dropout in the MLP, N mini-batches whose gradients are summed
(each scaled by 1/N) are one batch's gradient, and SGD on layers [0, P) on the device plus [P, L) on the
server is SGD on the whole model: split-federated training computes FL's model up to float rounding, so
the accuracies after the same epochs agree within a point (a few of the 360 test samples).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from edgeagent.cli.demo import LocalWorkers
from edgeagent.config import TrainConfig
from edgeagent.data import load_dataset
from edgeagent.errors import ProtocolError
from edgeagent.modes.splitfed.central import SplitFedRun
from edgeagent.modes.splitfed.choose import exhaustive_grid
from edgeagent.modes.splitfed.messages import SplitActivation
from edgeagent.protocol.messages import Status
from edgeagent.protocol.topics import Family
from edgeagent.protocol.wire import decode
from edgeagent.roles.central import Central, RunReport, latest_checkpoint
from edgeagent.splitfed.trial import candidates, schedule
from edgeagent.transport.mqtt import MqttTransport
from tests.helpers import LocalCluster

pytestmark = pytest.mark.slow


def shards(tmp_path: Path, k: int = 2, dataset: str = "digits") -> list[Path]:
    """The digits training set split IID into ``k`` shards (the test set stays with the central node)."""
    data = load_dataset(dataset, seed=0)
    order = torch.randperm(len(data.x_train), generator=torch.Generator().manual_seed(1))
    paths = []
    for i, part in enumerate(order.chunk(k)):
        path = tmp_path / f"shard-{i}.npz"
        np.savez(path, X=data.x_train[part].numpy(), y=data.y_train[part].numpy())
        paths.append(path)
    return paths


def run(
    broker: str,
    datasets: list[Path],
    *,
    epochs: int,
    kills: dict[str, int | str] | None = None,
    on_progress: Any = None,
    slowdowns: list[float] | None = None,
    links: list[float] | None = None,
    model: str = "mlp",
    dataset: str = "digits",
    **central: Any,
) -> tuple[RunReport, Central]:
    cluster = LocalCluster(
        broker,
        workers=len(datasets),
        slowdowns=slowdowns,
        on_progress=on_progress,
        worker_options={"kills": kills, "links": links, "datasets": [str(p) for p in datasets]},
        mode="split-federated",
        train=TrainConfig(
            model=model, dataset=dataset, epochs=epochs, batch_size=32, learning_rate=0.05, momentum=0.5
        ),
        **central,
    )
    return cluster.run(), cluster.node


def test_two_devices_reach_fl_accuracy_and_never_send_raw_inputs(mosquitto_url: str, tmp_path: Path) -> None:
    """Split at P = 2 with N = 2 against FL (P = L) on the same shards; every tensor on every topic of
    the split run is checked against the raw rows of both shards."""
    paths = shards(tmp_path)
    raw = {row.tobytes() for p in paths for row in np.load(p)["X"].reshape(-1, 64).astype(np.float32)}
    seen: list[tuple[str, Any]] = []
    undecoded: list[str] = []
    lock = threading.Lock()
    spy = MqttTransport(mosquitto_url, f"spy-{uuid.uuid4().hex[:6]}")
    assert spy.wait_connected(10)

    def on_message(topic: str, payload: bytes) -> None:
        try:
            _, msg = decode(payload)
        except ProtocolError as exc:  # nothing here may hide from the check below
            undecoded.append(f"{topic}: {exc}")
            return
        with lock:
            seen.append((topic, msg))

    spy.subscribe("edgeagent/#", on_message)
    try:
        split, node = run(
            mosquitto_url, paths, epochs=2, splitfed_plan="fixed", split_point=2, parallel_batches=2
        )
    finally:
        spy.close()
    fl, _ = run(mosquitto_url, paths, epochs=2, splitfed_plan="fl")
    assert isinstance(node.active, SplitFedRun)
    assert fl.final_accuracy > 0.85
    assert abs(split.final_accuracy - fl.final_accuracy) <= 0.01, (split.final_accuracy, fl.final_accuracy)
    assert [set(e["devices"]) for e in split.splitfed["epochs"]] == [{"worker-1", "worker-2"}] * 2

    assert not undecoded
    activations = [m for _, m in seen if isinstance(m, SplitActivation)]
    assert activations, "no activation crossed the broker"
    tensors = 0
    for topic, msg in seen:
        for value in vars(msg).values():
            items = value.values() if isinstance(value, dict) else [value]
            for t in items:
                if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                    continue
                tensors += 1
                if t.shape[-1] == 64 or t.shape[-3:] == (1, 8, 8):
                    rows = t.detach().to(torch.float32).reshape(-1, 64).numpy()
                    assert not any(r.tobytes() in raw for r in rows), f"raw input rows on {topic}"
    assert tensors > len(activations)
    for msg in activations:
        assert tuple(msg.x.shape[1:]) == (128,)  # the output of layer 1 (P = 2), never the 1x8x8 inputs


def test_server_side_models_in_parallel_give_the_sequential_global_model(
    mosquitto_url: str, tmp_path: Path
) -> None:
    """PiPar Fig. 3(c) against 3(b): the two devices' server-side models on two threads at once, then one
    after another on the central node's thread; each device's mini-batches run in arrival order either
    way, so the global model after FedAvg is the same to the bit."""
    paths = shards(tmp_path)
    weights, losses = [], []
    for threads in (2, 1):
        report, node = run(
            mosquitto_url,
            paths,
            epochs=1,
            splitfed_plan="fixed",
            split_point=1,
            parallel_batches=2,
            splitfed_server_threads=threads,
        )
        assert isinstance(node.active, SplitFedRun)
        assert report.splitfed["server_threads"] == threads
        weights.append(node.active.collect_weights())
        losses.append(report.test_loss_per_epoch)
    assert losses[0] == losses[1]
    assert weights[0].keys() == weights[1].keys()
    for k, v in weights[0].items():
        assert torch.equal(v, weights[1][k]), k


def test_the_exhaustive_search_trains_every_pair_for_real_and_takes_the_fastest(
    mosquitto_url: str, tmp_path: Path
) -> None:
    """--splitfed-plan exhaustive (the paper's baseline of eq. 28): one trial per common (P, N) with N <= 2
    and FL's (L, 1), each a real round of one iteration on both devices; the plan is the fastest trial's
    for every device; trials leave the global model and the run's counters as they were."""
    paths = shards(tmp_path)
    report, node = run(mosquitto_url, paths, epochs=1, splitfed_plan="exhaustive", exhaustive_max_n=2)
    assert isinstance(node.active, SplitFedRun)
    layers = node.active.layers
    trials = report.splitfed["planning"]["estimate"]["trials"]
    assert [(t["split"], t["parallel"]) for t in trials] == exhaustive_grid(layers, 32, 2)[1:]
    assert all(0 < t["epoch_seconds"] < float("inf") for t in trials)
    best = min(trials, key=lambda t: t["epoch_seconds"])
    assert set(map(tuple, report.splitfed["plan"].values())) == {(best["split"], best["parallel"])}
    assert report.splitfed["planning"]["selection_seconds"] > 0
    (epoch,) = report.splitfed["epochs"]
    assert epoch["epoch"] == 0 and set(epoch["devices"]) == {"worker-1", "worker-2"}
    # One epoch of training after the trials: the counters hold that epoch's iterations only.
    split, _ = best["split"], best["parallel"]
    per_device = [e["iterations"] for e in epoch["devices"].values()]
    if split < layers:
        assert report.batches == sum(per_device)
    assert report.final_accuracy > 0.5


@pytest.mark.serial  # the estimate must measure split training faster than FL, which a neighbour skews
def test_ours_tries_n_in_the_first_epoch_and_keeps_the_fastest(mosquitto_url: str, tmp_path: Path) -> None:
    """--splitfed-plan ours (default trial): the first epoch's rounds carry each device's schedule of N,
    the server cuts every iteration by it (no mini-batch is refused), each device reports every
    iteration's seconds, and the next epoch runs the N the trial measured fastest, at the same P."""
    paths = shards(tmp_path, dataset="digits28")  # PiPar's VGG-5 on 28x28, slow devices, 4G+ uplinks
    # 16x slower devices: the estimate splits the model (P = 2, N 4-5, about 5.0 s an epoch against FL's
    # 6.9 s). At 8x the two were within 3 % of each other and FL (N = 1: nothing to try) won one run in
    # three.
    report, _ = run(
        mosquitto_url,
        paths,
        epochs=2,
        splitfed_plan="ours",
        slowdowns=[16.0, 16.0],
        links=[20.0, 20.0],
        model="vgg5",
        dataset="digits28",
    )
    planning = report.splitfed["planning"]
    first, second = report.splitfed["epochs"]
    trial = planning.get("trial")
    assert trial is not None, f"the estimate left nothing to try ({first['plan']}): change the set-up"
    iterations = len(np.load(paths[0])["X"]) // 32
    for device, plan in trial["schedules"].items():
        p, n = first["plan"][device]
        assert plan == schedule(n, iterations)
        seconds = first["devices"][device]["iteration_seconds"]
        assert len(seconds) == first["devices"][device]["iterations"] == iterations
        assert all(t > 0 for t in seconds)
        kept = second["plan"][device]
        assert kept[0] == p and kept[1] in candidates(n) and trial["picked"][device] == kept
    # Every mini-batch of every iteration was taken: the server's updates are the devices' iterations.
    assert report.batches == sum(d["iterations"] for e in (first, second) for d in e["devices"].values())
    assert report.final_accuracy > 0.5


def test_a_killed_device_is_left_out_and_rejoins_with_the_global_model(
    mosquitto_url: str, tmp_path: Path
) -> None:
    """worker-1 is SIGKILLed at its 30th iteration (epoch 1; a shard has 22 iterations per epoch): it is
    left out of that epoch's FedAvg while worker-2 goes on; restarted, it starts a later epoch from the
    global model sent then. The restart is made while the central node waits in its progress hook for the
    new process's "idle" status, so the rejoin does not race the (sub-second) epochs."""
    paths = shards(tmp_path)
    restarted = threading.Event()
    idle = threading.Event()

    def on_status(_topic: str, payload: bytes) -> None:
        _, msg = decode(payload)
        if isinstance(msg, Status) and msg.state == "idle" and restarted.is_set():
            idle.set()

    spy = MqttTransport(mosquitto_url, f"spy-{uuid.uuid4().hex[:6]}")
    assert spy.wait_connected(10)

    def on_progress(values: dict[str, Any], node: Central, local: LocalWorkers) -> None:
        active = node.active
        if not isinstance(active, SplitFedRun) or restarted.is_set():
            return
        if "worker-1" in active.left_out or any("worker-1" in e["left_out"] for e in active.epochs):
            spy.subscribe(node.topics.device(Family.STATUS, "worker-1"), on_status)
            restarted.set()
            local.restart("worker-1")
            assert idle.wait(60), "the restarted worker-1 never said it is idle"

    try:
        report, _ = run(
            mosquitto_url,
            paths,
            epochs=4,
            kills={"worker-1": 30},
            on_progress=on_progress,
            splitfed_plan="fixed",
            split_point=1,
            parallel_batches=2,
        )
    finally:
        spy.close()
    epochs = report.splitfed["epochs"]
    assert restarted.is_set()
    assert set(epochs[0]["devices"]) == {"worker-1", "worker-2"}
    out = next(k for k, e in enumerate(epochs) if "worker-1" in e["left_out"])
    assert out >= 1 and set(epochs[out]["devices"]) == {"worker-2"}
    back = next(k for k, e in enumerate(epochs) if k > out and "worker-1" in e["devices"])
    assert all(set(e["devices"]) == {"worker-2"} for e in epochs[out:back])
    assert set(epochs[-1]["devices"]) == {"worker-1", "worker-2"}
    assert epochs[back]["devices"]["worker-1"]["started_from_global"]
    assert report.final_accuracy > 0.8


def test_the_server_resumes_from_its_checkpoint_after_a_sigkill(mosquitto_url: str, tmp_path: Path) -> None:
    """The central node (a process) writes a checkpoint after every epoch; SIGKILLed once the first is
    written, a new central node with ``--resume`` continues the same run with the same devices (still in
    the run) from the next epoch. The node kills itself at its first checkpoint (``--die-after-checkpoint``),
    so the kill lands inside the run however fast the run is."""
    paths = shards(tmp_path)
    cluster = f"t{uuid.uuid4().hex[:8]}"
    folder, report_path = tmp_path / "checkpoints", tmp_path / "report.json"
    flags = [
        "--broker", mosquitto_url, "--cluster", cluster, "--workers", "2", "--mode", "split-federated",
        "--splitfed-plan", "fixed", "--split-point", "2", "--parallel-batches", "2",
    ]  # fmt: skip
    central = [sys.executable, "-m", "edgeagent", "central", *flags]
    local = LocalWorkers(
        2, mosquitto_url, cluster, [1.0, 1.0], links=[1.0, 1.0], datasets=[str(p) for p in paths]
    )
    local.start_all()
    # SIGKILLed by itself right after its first checkpoint (fault injection): inside the run, however
    # fast the run is.
    kill = ("--die-after-checkpoint", "1")
    first = subprocess.Popen([*central, "--epochs", "2", "--checkpoint", str(folder), *kill])
    try:
        assert first.wait(timeout=120) == -signal.SIGKILL, "the central node was not killed at its checkpoint"
        checkpoint = latest_checkpoint(folder, cluster)
        assert checkpoint is not None
        resumed = subprocess.run(
            [*central, "--resume", str(checkpoint), "--report", str(report_path)], timeout=120, check=False
        )
        assert resumed.returncode == 0
    finally:
        if first.poll() is None:
            first.kill()
        local.stop()
    report = json.loads(report_path.read_text())
    (recovery,) = report["recoveries"]
    assert recovery["case"] == "central" and recovery["resumed_from"] >= 0
    epochs = report["splitfed"]["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1] and len(report["test_accuracy_per_epoch"]) == 2
    assert all(set(e["devices"]) == {"worker-1", "worker-2"} for e in epochs)
    assert report["final_accuracy"] > 0.8
