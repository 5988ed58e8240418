"""Data-parallel training (``--mode allreduce``) with real processes and a real broker: the fault-tolerant
tree allreduce through a failed link, and a SIGKILLed device excluded while the others go on.

What is checked is deterministic: after every step every member holds the same weights (equal digests),
each member's averaged gradient names every member as a contributor exactly once, and the trained model
equals a single-process reference that applies, step by step, the exact mean of the same shards'
gradients over the members the run reports (no contribution lost or counted twice).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from edgeagent.allreduce.replica import Replica
from edgeagent.allreduce.shards import batch, shard
from edgeagent.cli.demo import LocalWorkers
from edgeagent.config import TrainConfig
from edgeagent.data import load_dataset
from edgeagent.models import ModelSpec
from edgeagent.modes.allreduce.central import AllreduceRun
from edgeagent.protocol.messages import Ready
from edgeagent.protocol.options import TrainOptions
from edgeagent.roles.central import Central, RunReport
from tests.helpers import LocalCluster

pytestmark = pytest.mark.slow

HIDDEN = [32]
TRAIN = TrainConfig(dataset="digits", batch_size=20, model_options={"hidden": HIDDEN}, learning_rate=0.1)


def run(
    broker: str,
    workers: int,
    steps: int,
    save: Path,
    *,
    kill: tuple[str, int] | None = None,
    restart: bool = False,
    **central: Any,
) -> tuple[RunReport, list[str]]:
    """A run of ``steps`` steps; ``kill=(device, step)``: SIGKILL it when that step is done (and start it
    again at once with ``restart``)."""
    train = TRAIN.model_copy(update={"max_batches": steps, "epochs": 100})  # the steps bound the run
    killed: list[str] = []
    joining: list[str] = []

    def progress(values: dict[str, Any], node: Central, local: LocalWorkers) -> None:
        if restart and killed and not joining:
            wait_for_ready(node, killed[0], joining)
        if kill is not None and values.get("batch") == kill[1] and not killed:
            device = kill[0]
            killed.append(device)
            os.kill(local.procs[device].pid, signal.SIGKILL)
            if restart:
                local.procs[device].wait(10)
                died = time.monotonic()
                local.restart(device)
                # Until the new process heartbeats (stamped on the network thread while this one waits).
                state = node.workers[device]
                deadline = died + 60
                while not (state.online and state.last_heartbeat > died) and time.monotonic() < deadline:
                    time.sleep(0.05)

    cluster = LocalCluster(
        broker,
        workers=workers,
        on_progress=progress,
        train=train,
        mode="allreduce",
        save_model=str(save),
        **central,
    )
    return cluster.run(), killed


def wait_for_ready(node: Central, device: str, seen: list[str]) -> None:
    """Once the run has assigned ``device`` again, hold the run until its ``ready`` has come (queued on the
    network thread while the run waits here): a restarted process takes seconds to build its replica, and
    the run's steps must not all be over by then."""
    run = node.active
    assert isinstance(run, AllreduceRun)
    if device not in run.joiners:
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        queued = list(node.inbox.queue)
        if device in run.ready or any(isinstance(i.message, Ready) and i.sender == device for i in queued):
            seen.append(device)
            return
        time.sleep(0.05)


def reference(report: RunReport) -> dict[str, torch.Tensor]:
    """The model after the run's steps, in one process: each step's exact mean over its members' shards."""
    data = load_dataset(TRAIN.dataset, seed=TRAIN.seed, test_fraction=TRAIN.test_fraction)
    spec = ModelSpec(TRAIN.model, data.in_shape, data.num_classes, (("hidden", tuple(HIDDEN)),))
    replica = Replica(spec, TRAIN.seed, TrainOptions.of(TRAIN))
    workers = report.workers[1:]
    shards = {d: shard(data.y_train, i, len(workers), "iid", TRAIN.seed) for i, d in enumerate(workers)}
    per_epoch = report.allreduce["steps_per_epoch"]
    loads = ("allreduce-joined", "allreduce-resumed")  # every member loaded the same weights at that step
    joins = {e["step"] for e in report.allreduce["events"] if e["name"] in loads}
    for it in report.allreduce["iterations"]:
        if it["step"] in joins:  # every member loads the joiner's model: momentum starts anew everywhere
            replica.optimizer.state.clear()
        total = torch.zeros(replica.size)
        for d in it["members"]:
            rows = batch(shards[d], it["step"], per_epoch, TRAIN.batch_size, TRAIN.seed)
            total += replica.gradient(data.x_train[rows], data.y_train[rows])[0]
        replica.apply(total / len(it["members"]), TRAIN.batch_size)
    return replica.collect_state()


def check_steps(report: RunReport, steps: int) -> None:
    iterations = report.allreduce["iterations"]
    assert [it["step"] for it in iterations] == list(range(steps))
    for it in iterations:
        members = it["members"]
        assert set(it["digests"]) == set(members), it
        assert len(set(it["digests"].values())) == 1, f"step {it['step']}: replicas differ: {it['digests']}"
        for device, contributors in it["contributors"].items():
            assert contributors == list(range(len(members))), (it["step"], device, contributors)


def check_model(report: RunReport, saved: Path) -> None:
    trained = torch.load(saved, weights_only=True)
    expected = reference(report)
    assert set(trained) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(trained[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


def test_ft_tree_through_a_failed_link_keeps_the_replicas_identical_and_the_mean_exact(
    mosquitto_url: str, tmp_path: Path
) -> None:
    """Four devices (ranks 0-3: rank 3's parent is rank 1, its uncle rank 2). The link between worker-2
    and worker-4 fails during steps 2-3: the tree goes on through the uncle, and steps 0-1 and 4-5 run
    without a fault in the same run."""
    saved = tmp_path / "model.pt"
    report, _ = run(mosquitto_url, 4, 6, saved, fail_links=["worker-2,worker-4@2:3"])
    assert report.mode == "allreduce" and report.allreduce["collective"] == "ft-tree"
    check_steps(report, 6)
    iterations = report.allreduce["iterations"]
    assert [bool(it["failed_links"]) for it in iterations] == [False, False, True, True, False, False]
    assert iterations[-1]["dropped"] > 0  # the failure was real: messages on that link were not sent
    assert all(it["members"] == report.workers[1:] for it in iterations)
    check_model(report, saved)


def test_a_killed_device_is_excluded_and_the_others_go_on(amqtt_url: str, tmp_path: Path) -> None:
    """worker-2 of three is SIGKILLed once step 1 is done: the next step runs over the two others (again, if
    it had started with three), and the model is the exact mean over whoever each step counted."""
    saved = tmp_path / "model.pt"
    report, killed = run(amqtt_url, 3, 5, saved, kill=("worker-2", 1), restart_window=0.0)
    assert killed == ["worker-2"]
    check_steps(report, 5)
    iterations = report.allreduce["iterations"]
    assert [it["members"] for it in iterations[:2]] == [["worker-1", "worker-2", "worker-3"]] * 2
    assert [it["members"] for it in iterations[2:]] == [["worker-1", "worker-3"]] * 3
    excluded = [e for e in report.allreduce["events"] if e["name"] == "allreduce-excluded"]
    assert [e["devices"] for e in excluded] == [["worker-2"]]
    check_model(report, saved)


STEPS = 12  # the run waits for the restarted device's ready; it joins within a few steps


def test_a_device_that_comes_back_rejoins_with_the_current_model(amqtt_url: str, tmp_path: Path) -> None:
    """worker-3 of three is SIGKILLed once step 1 is done and started again at once: it is excluded, then
    assigned again when it announces itself, and joins at a later step with the current model; from then
    on the three replicas are identical again and the model is still the exact mean step by step."""
    saved = tmp_path / "model.pt"
    report, killed = run(amqtt_url, 3, STEPS, saved, kill=("worker-3", 1), restart=True, restart_window=0.0)
    assert killed == ["worker-3"]
    check_steps(report, STEPS)
    events = report.allreduce["events"]
    joined = [e for e in events if e["name"] == "allreduce-joined"]
    assert [e["devices"] for e in joined] == [["worker-3"]], events
    at = joined[0]["step"]
    members = [it["members"] for it in report.allreduce["iterations"]]
    assert members[2:at] == [["worker-1", "worker-2"]] * (at - 2)
    assert members[at:] == [["worker-1", "worker-2", "worker-3"]] * (STEPS - at)
    check_model(report, saved)


@pytest.mark.parametrize("collective", ["ft-tree", "ring"])
def test_8_bit_gradients_keep_the_replicas_identical_and_the_run_trains(
    mosquitto_url: str, tmp_path: Path, collective: str
) -> None:
    """--compression 8: the sums of the reduce direction travel as stochastic 8-bit values, the broadcast
    exact; so every replica still applies the same mean (equal digests after every step), the loss falls
    and the test accuracy ends well above chance (10 classes), with about 4x fewer gradient bytes."""
    steps = 12
    report, _ = run(mosquitto_url, 3, steps, tmp_path / "model.pt", collective=collective, compression="8")
    assert report.compression == "8"
    check_steps(report, steps)
    losses = [it["loss"] for it in report.allreduce["iterations"]]
    assert sum(losses[-4:]) < sum(losses[:4]), losses
    assert report.final_accuracy > 0.3, report.test_accuracy_per_epoch
    assert 3.5 < report.compression_ratio < 4.0
