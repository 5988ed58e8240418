"""`--save-model model.safetensors` after a real run: one call gives back the model the run evaluated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import edgeagent
from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.data import load_dataset

pytestmark = pytest.mark.slow


def test_saved_model_loads_in_one_call_and_scores_as_the_run_said(
    amqtt_url: str, cluster: str, tmp_path: Path
) -> None:
    saved = tmp_path / "model.safetensors"
    train = TrainConfig(epochs=1)
    config = CentralConfig(cluster=cluster, train=train, save_model=str(saved), progress=False)
    report = run_demo(config, workers=2, slowdowns=[], broker=amqtt_url, show_progress=False)

    card = json.loads(saved.with_suffix(".json").read_text())
    assert card["run_id"] == report.run_id
    assert card["model"]["name"] == report.model and card["dataset"] == "digits"

    model = edgeagent.load_model(str(saved))
    data = load_dataset("digits", seed=0)
    with torch.no_grad():
        accuracy = (model(data.x_test).argmax(1) == data.y_test).float().mean().item()
    assert accuracy == pytest.approx(report.final_accuracy, abs=0.01)
    assert accuracy > 0.5  # chance is 0.1
