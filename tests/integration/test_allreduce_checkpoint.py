"""Checkpoints of the central node in ``--mode allreduce`` with real processes and a real broker: SIGKILLed
after its first checkpoint, a new central node with ``--resume`` finishes the same run, every member
starting from the checkpoint's weights (seen on the wire), and the model is the exact mean step by step."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
import torch

from edgeagent.cli.demo import LocalWorkers
from edgeagent.errors import ProtocolError
from edgeagent.modes.allreduce.messages import AllreduceStep
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode
from edgeagent.roles.central import RunReport, latest_checkpoint
from edgeagent.transport.mqtt import MqttTransport
from tests.integration.test_allreduce import HIDDEN, TRAIN, check_model, check_steps

pytestmark = pytest.mark.slow


def test_the_central_node_resumes_from_its_checkpoint_after_a_sigkill(
    mosquitto_url: str, tmp_path: Path
) -> None:
    """Two epochs; the central node (a process) is SIGKILLed once its first checkpoint is written. The
    new one (``--resume``) sends the checkpoint's weights with the step after it, and the run goes on from
    there: every step is in the report once, the replicas agree after each, and the trained model equals
    the one-process reference (momentum restarting at the resumed step, as every member loads weights)."""
    cluster = f"t{uuid.uuid4().hex[:8]}"
    folder, report_path, saved = tmp_path / "checkpoints", tmp_path / "report.json", tmp_path / "model.pt"
    flags = [
        "--broker", mosquitto_url, "--cluster", cluster, "--workers", "2", "--mode", "allreduce",
        "--dataset", TRAIN.dataset, "--batch-size", str(TRAIN.batch_size),
        "--learning-rate", str(TRAIN.learning_rate),
        "--model-option", f"hidden={HIDDEN}",
    ]  # fmt: skip
    central = [sys.executable, "-m", "edgeagent", "central", *flags]
    steps: list[AllreduceStep] = []
    lock = threading.Condition()  # on_message notifies: the test waits for steps, not for time

    def on_message(topic: str, payload: bytes) -> None:
        try:
            _, msg = decode(payload)
        except ProtocolError:
            return
        if isinstance(msg, AllreduceStep):
            with lock:
                steps.append(msg)
                lock.notify_all()

    spy = MqttTransport(mosquitto_url, f"spy-{uuid.uuid4().hex[:6]}")
    assert spy.wait_connected(10)
    spy.subscribe(Topics(cluster).fixed(Family.COMMIT), on_message)
    local = LocalWorkers(2, mosquitto_url, cluster, [1.0, 1.0]).start_all()
    # SIGKILLed by itself right after its first checkpoint (fault injection): inside the run, however
    # fast the run is.
    kill = ("--die-after-checkpoint", "1")
    first = subprocess.Popen([*central, "--epochs", "2", "--checkpoint", str(folder), *kill])
    try:
        assert first.wait(timeout=120) == -signal.SIGKILL, "the central node was not killed at its checkpoint"
        checkpoint = latest_checkpoint(folder, cluster)
        assert checkpoint is not None
        state = torch.load(checkpoint, weights_only=True)  # the last one written before the kill
        with lock:  # the killed node's last step (sent before its checkpoint) has reached the spy
            seen = lock.wait_for(lambda: any(m.step == state["step"] for m in steps), timeout=30)
            assert seen, f"the spy never saw step {state['step']}"
            before = len(steps)
        resumed = subprocess.run(
            [*central, "--resume", str(checkpoint), "--report", str(report_path), "--save-model", str(saved)],
            timeout=120,
            check=False,
        )
        assert resumed.returncode == 0
    finally:
        if first.poll() is None:
            first.kill()
        local.stop()
        spy.close()
    assert state["mode"] == "allreduce" and state["format"] == 1
    with lock:
        start = steps[before]  # the resumed central node's first step
    assert start.run_id == state["run_id"] and start.step == state["step"] + 1
    assert start.weights is not None and torch.equal(start.weights, state["weights"])
    raw = json.loads(report_path.read_text())
    report = RunReport(**{f.name: raw[f.name] for f in dataclasses.fields(RunReport) if f.name in raw})
    (recovery,) = report.recoveries
    assert recovery["case"] == "central" and recovery["resumed_from"] == state["step"]
    assert len(report.test_accuracy_per_epoch) == 2
    check_steps(report, 2 * report.allreduce["steps_per_epoch"])
    check_model(report, saved)
