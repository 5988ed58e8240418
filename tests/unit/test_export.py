"""A saved model: safetensors with its card, the old state dict, one call to load either."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import edgeagent
from edgeagent.errors import TrainingError
from edgeagent.export import card_path, load_model, model_card, save_model_file
from edgeagent.models import ModelSpec, build_model

SPEC = ModelSpec("cnn", (1, 8, 8), 10)


def _trained() -> torch.nn.Sequential:
    model = build_model(SPEC, seed=3)  # not load_model's seed: the weights must come from the file
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    return model


def test_safetensors_with_card_round_trip(tmp_path: Path) -> None:
    model = _trained()
    path = tmp_path / "model.safetensors"
    card = model_card(SPEC, run_id="r1", dataset="digits", epochs=2, batch_size=32)
    save_model_file(str(path), model.state_dict(), card)

    with safe_open(str(path), framework="pt") as f:  # any safetensors reader sees the card
        assert json.loads(f.metadata()["edgeagent"])["run_id"] == "r1"
    beside = json.loads(card_path(path).read_text())
    assert beside == card
    assert beside["input_shape"] == [1, 8, 8] and beside["classes"] == 10
    assert beside["model"]["name"] == "cnn" and beside["edgeagent"] == edgeagent.__version__
    assert beside["training"] == {"epochs": 2, "batch_size": 32}

    loaded = edgeagent.load_model(str(path))
    assert not loaded.training
    x = torch.randn(4, 1, 8, 8)
    torch.testing.assert_close(loaded(x), model.eval()(x))


def test_the_old_state_dict_stays_readable(tmp_path: Path) -> None:
    model = _trained()
    old = tmp_path / "old.pt"
    torch.save(model.state_dict(), old)  # what --save-model wrote before: no card
    with pytest.raises(TrainingError, match="no model card"):
        load_model(old)
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(load_model(old, spec=SPEC)(x), model.eval()(x))
    # A .pt written now gets its card beside it, and loads without a spec.
    new = tmp_path / "new.pt"
    save_model_file(str(new), model.state_dict(), model_card(SPEC, run_id="r2"))
    assert isinstance(torch.load(new, weights_only=True), dict)
    torch.testing.assert_close(load_model(new)(x), model.eval()(x))


def test_a_file_that_does_not_fit_says_so(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_model_file(str(path), _trained().state_dict(), model_card(ModelSpec("mlp", (64,), 10), run_id="r"))
    with pytest.raises(TrainingError, match="does not fit the model mlp"):
        load_model(path)
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(TrainingError, match="cannot read"):
        load_model(tmp_path / "junk.safetensors")
    assert card_path("a/model.json") == Path("a/model.json.card.json")
