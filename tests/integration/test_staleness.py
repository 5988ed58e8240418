"""Staleness compensation and the synchronous schedule in real runs: a central node and worker processes
over a real broker, held to the offline arithmetic of the same rules (edgeagent.pipeline.replay) and to
single-process SGD."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.data import batch_indices, load_dataset
from edgeagent.models import ModelSpec, build_model
from edgeagent.pipeline.replay import build_stages, merged_state, replay
from edgeagent.protocol.options import TrainOptions

pytestmark = pytest.mark.slow

BATCHES = 24


def _batches(train: TrainConfig) -> tuple[ModelSpec, list[tuple[torch.Tensor, torch.Tensor]]]:
    data = load_dataset(train.dataset, seed=train.seed)
    spec = ModelSpec(train.model, data.in_shape, data.num_classes)
    per_epoch = batch_indices(data.x_train.shape[0], train.batch_size, epoch=0, seed=train.seed)
    return spec, [(data.x_train[i], data.y_train[i]) for i in per_epoch[:BATCHES]]


def _run(
    url: str, cluster: str, tmp_path: Path, train: TrainConfig, slowdowns: list[float]
) -> tuple[dict[str, torch.Tensor], list[int]]:
    saved = tmp_path / "model.pt"
    config = CentralConfig(
        cluster=cluster,
        train=train,
        save_model=str(saved),
        progress=False,
        partition="uniform",  # no re-split: the split of batch 0 holds to the end
        estimator="capacity",
    )
    report = run_demo(config, workers=2, slowdowns=slowdowns, broker=url, show_progress=False)
    assert report.batches == BATCHES and not report.recoveries
    assert all(p["batch"] == 0 for p in report.partitions), report.partitions
    return torch.load(saved, weights_only=True), list(report.partitions[-1]["points"])


def test_a_three_process_run_with_the_default_rule_equals_its_offline_replay(
    amqtt_url: str, cluster: str, tmp_path: Path
) -> None:
    """Every stage forwards the version its own delay names and predicts from it: whatever the order
    messages arrived in, the weights are the offline replay's (one slow worker shuffles the timing)."""
    train = TrainConfig(max_batches=BATCHES, epochs=1)
    assert train.staleness == "lookahead" and train.momentum == 0.9 and train.learning_rate == 0.05
    trained, points = _run(amqtt_url, cluster, tmp_path, train, slowdowns=[1, 1, 4])
    spec, batches = _batches(train)
    stages = build_stages(spec, TrainOptions.of(train), points, seed=train.seed)
    replay(stages, batches)
    expected = merged_state(stages)
    assert set(trained) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(trained[key], value, rtol=1e-5, atol=1e-6)
    # And the rule did something: plain SGD on the same batches ends elsewhere.
    plain = build_stages(spec, TrainOptions.of(train.model_copy(update={"staleness": "none"})), points)
    replay(plain, batches)
    assert any(not torch.allclose(merged_state(plain)[k], v, atol=1e-4) for k, v in expected.items())


def test_the_sync_schedule_equals_single_process_sgd(amqtt_url: str, cluster: str, tmp_path: Path) -> None:
    """Three uneven micro-batches (11, 11 and 10 rows) per batch through stages of unequal speed: the
    weights are those of torch.optim.SGD on the whole batches in one process."""
    train = TrainConfig(max_batches=BATCHES, epochs=1, schedule="sync", micro_batches=3)
    trained, _ = _run(amqtt_url, cluster, tmp_path, train, slowdowns=[1, 1, 4])
    spec, batches = _batches(train)
    model = build_model(spec, seed=train.seed)
    sgd = torch.optim.SGD(
        model.parameters(), lr=train.learning_rate, momentum=train.momentum, weight_decay=train.weight_decay
    )
    for x, y in batches:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        sgd.step()
        sgd.zero_grad()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(trained[key], value, rtol=1e-5, atol=1e-6)


def test_a_diverging_run_exits_with_one_line_saying_so(amqtt_url: str, cluster: str) -> None:
    """``--learning-rate 1e9``: the first batch's loss is not finite; the run ends at once with exit 1 and
    one line naming the batch and what to change (no recovery loop)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgeagent",
            "demo",
            "--learning-rate",
            "1e9",
            "--epochs",
            "2",
            "--no-progress",
            "--broker",
            amqtt_url,
            "--cluster",
            cluster,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    assert "loss diverged at batch" in errors[0] and "lower --learning-rate" in errors[0], errors


def test_a_run_above_chance_is_told_and_a_warned_one_ends_with_its_report(
    amqtt_url: str, cluster: str
) -> None:
    """Plain stale SGD at lr 0.5 blows up: the report says so and why, and with ``divergence: warn`` the run
    still returns its figures."""
    train = TrainConfig(epochs=2, learning_rate=0.5, staleness="none", divergence="warn")
    config = CentralConfig(cluster=cluster, train=train, progress=False)
    report = run_demo(config, workers=2, slowdowns=[], broker=amqtt_url, show_progress=False)
    assert "loss diverged at" in report.diverged and "lower --learning-rate" in report.diverged
    assert report.batches >= 1
