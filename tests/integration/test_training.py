"""Multi-process training over real brokers: the central node here, workers as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from edgeagent.cli.demo import run_demo
from edgeagent.config import PIPELINED_LEARNING_RATES, CentralConfig, TrainConfig
from edgeagent.data import batch_indices, load_dataset
from edgeagent.models import ModelSpec, build_model

pytestmark = pytest.mark.slow


def test_three_stage_gradients_match_unsplit_reference(amqtt_url: str, cluster: str, tmp_path: Path) -> None:
    """One batch, no staleness: the split model's update equals the unsplit model's gradient step."""
    lr = 0.5
    train = TrainConfig(
        model="cnn",
        dataset="digits",
        batch_size=32,
        learning_rate=lr,
        momentum=0.0,
        weight_decay=0.0,
        in_flight=1,
        staleness="none",
        max_batches=1,
        epochs=1,
    )
    saved = tmp_path / "model.pt"
    config = CentralConfig(cluster=cluster, train=train, save_model=str(saved), progress=False)
    report = run_demo(config, workers=2, slowdowns=[], broker=amqtt_url, show_progress=False)
    assert report.batches == 1
    assert len(report.partitions[0]["points"]) == 4  # three stages

    data = load_dataset("digits", seed=0)
    spec = ModelSpec("cnn", data.in_shape, data.num_classes)
    reference = build_model(spec, seed=0)
    initial = {k: v.clone() for k, v in reference.state_dict().items()}
    idx = batch_indices(data.x_train.shape[0], 32, epoch=0, seed=0)[0]
    torch.nn.functional.cross_entropy(reference(data.x_train[idx]), data.y_train[idx]).backward()

    trained = torch.load(saved, weights_only=True)
    assert set(trained) == set(initial)
    for name, p in reference.named_parameters():
        assert p.grad is not None
        split_grad = (initial[name] - trained[name]) / lr
        torch.testing.assert_close(split_grad, p.grad, rtol=1e-4, atol=1e-6)


def test_short_run_on_digits_learns(broker_url: str, cluster: str) -> None:
    """Two epochs on digits with the default asynchronous pipeline, on amqtt and on Mosquitto."""
    train = TrainConfig(epochs=2)
    config = CentralConfig(cluster=cluster, train=train, progress=False)
    report = run_demo(config, workers=2, slowdowns=[], broker=broker_url, show_progress=False)
    assert report.epochs == 2
    assert report.final_accuracy > 0.5  # chance is 0.1
    assert report.samples_per_second > 0
    assert report.partitions and report.partitions[0]["batch"] == 0


def test_demo_command_reaches_90_percent_on_mosquitto(mosquitto_url: str, tmp_path: Path) -> None:
    """The README's demo, pointed at a Mosquitto broker, as a user would run it."""
    report_file = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgeagent",
            "demo",
            "--broker",
            mosquitto_url,
            "--report",
            str(report_file),
            "--no-progress",
            "--log-level",
            "WARNING",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(report_file.read_text())
    for key in (
        "final_accuracy",
        "test_accuracy_per_epoch",
        "samples_per_second",
        "batches",
        "epochs",
        "wall_seconds",
        "partitions",
        "recoveries",
    ):
        assert key in report
    assert report["final_accuracy"] >= 0.90, report["test_accuracy_per_epoch"]
    assert report["recoveries"] == []


def test_garbage_on_live_topics_is_dropped_and_the_run_completes(amqtt_url: str, cluster: str) -> None:
    """Malformed payloads on every topic the roles subscribe to, while they train."""
    import threading

    from edgeagent.protocol.topics import Family, Topics
    from edgeagent.transport.mqtt import MqttTransport

    topics = Topics(cluster)
    targets = [
        topics.activations(0, "central"),
        topics.activations(1, "worker-1"),
        topics.gradients(1, "worker-1"),
        topics.gradients(2, "worker-2"),
        topics.results(2, "worker-2"),
        topics.fixed(Family.COMMAND),
        topics.device(Family.ANNOUNCE, "worker-1"),
        topics.device(Family.CONTROL, "worker-1"),
        topics.device(Family.REPLY, "worker-2"),
        topics.device(Family.HEARTBEAT, "worker-1"),
        f"{topics.base}/no/such/topic",
    ]
    payloads = [
        b"",
        b"\xff\x00garbage",
        b'{"v":99,"k":"gradient","s":"x","b":{}}',
        b"\xd9\x9c\x41\x80",
        b"{" * 50,
    ]
    stop = threading.Event()
    sent = [0]

    def flood() -> None:
        attacker = MqttTransport(amqtt_url, f"attacker-{cluster}")
        try:
            attacker.wait_connected(10)
            while not stop.is_set() and sent[0] < 2000:
                for t in targets:
                    for p in payloads:
                        attacker.publish(t, p, qos=0)
                        sent[0] += 1
                stop.wait(0.05)
        finally:
            attacker.close()

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    try:
        config = CentralConfig(cluster=cluster, train=TrainConfig(epochs=2), progress=False)
        report = run_demo(config, workers=2, slowdowns=[], broker=amqtt_url, show_progress=False)
    finally:
        stop.set()
        thread.join(10)
    assert sent[0] > 100
    assert report.epochs == 2
    assert report.final_accuracy > 0.5


def test_compressed_run_learns_and_sends_a_sixteenth(amqtt_url: str, cluster: str) -> None:
    """2-bit activations and 8-bit gradients over a real broker: the run learns and stage 0 sends ~1/16."""
    config = CentralConfig(cluster=cluster, train=TrainConfig(epochs=3), progress=False, compression="2")
    report = run_demo(config, workers=2, slowdowns=[], broker=amqtt_url, show_progress=False)
    assert report.compression == "2"
    # 2 bits of 32 for the codes; the codec's header and scales cost a few percent on these 16 KB tensors.
    assert 14.5 <= report.compression_ratio_tensors <= 16
    # Whole messages (envelope, labels) shrink less: what the link really saves.
    assert 2 < report.compression_ratio < report.compression_ratio_tensors
    assert report.final_accuracy > 0.6


def test_a_six_stage_pipeline_trains_at_the_models_rate_scaled_to_its_staleness(
    mosquitto_url: str, cluster: str
) -> None:
    """The rate patch of earlier versions, asked for (``pipelined_rate``): MobileNetV2's pipelined rate
    holds up to 4 stages; 6 stages (5 updates old) take 3/5 of it, and the stages get it with their options
    (the report's rate is the one they were sent)."""
    train = TrainConfig(
        model="mobilenetv2", dataset="digits", batch_size=32, epochs=1, max_batches=3, pipelined_rate=True
    )
    config = CentralConfig(
        cluster=cluster, train=train, progress=False, partition="uniform", estimator="capacity"
    )
    assert config.model_rate
    report = run_demo(config, workers=5, slowdowns=[], broker=mosquitto_url, show_progress=False)
    assert report.batches == 3 and len(report.partitions[0]["points"]) == 7
    assert report.learning_rate == pytest.approx(PIPELINED_LEARNING_RATES["mobilenetv2"] * 3 / 5)
