"""A run trains at the rate and momentum a single device would use (0.05, 0.9), whatever its model and
depth; the rate patch of earlier versions (``pipelined_rate``) is an option to compare against: then a
stale run that sets no rate takes its model's pipelined rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeagent.config import (
    PIPELINED_LEARNING_RATES,
    PIPELINED_RATE_STALENESS,
    CentralConfig,
    DemoConfig,
    TrainConfig,
    build,
    load,
    pipelined_learning_rate,
    staleness_scaled,
)
from edgeagent.errors import ConfigError

DEFAULT = TrainConfig().learning_rate
RATE = PIPELINED_LEARNING_RATES["mobilenetv2"]


def test_the_pipelined_rate_is_a_lower_one() -> None:
    assert DEFAULT == 0.05 and TrainConfig().momentum == 0.9
    assert 0 < RATE < DEFAULT


@pytest.mark.parametrize("model", ["mlp", "cnn", "mobilenetv2"])
@pytest.mark.parametrize("mode", ["pipeline", "hybrid"])
def test_by_default_every_model_trains_at_the_single_device_rate_at_any_depth(model: str, mode: str) -> None:
    config = CentralConfig(mode=mode, train=TrainConfig(model=model))
    assert config.train.learning_rate == DEFAULT and not config.model_rate
    assert config.rate_for(8) == DEFAULT and config.for_devices(8) is config
    assert build(CentralConfig, {"mode": mode, "train": {"model": model}}).train.learning_rate == DEFAULT


@pytest.mark.parametrize("mode", ["pipeline", "hybrid"])
def test_a_stale_run_that_sets_no_rate_takes_the_models(mode: str, tmp_path: Path) -> None:
    train = TrainConfig(model="mobilenetv2", pipelined_rate=True)
    assert CentralConfig(mode=mode, train=train).train.learning_rate == RATE
    data = {"mode": mode, "train": {"model": "mobilenetv2", "pipelined_rate": True}}
    assert build(CentralConfig, data).train.learning_rate == RATE
    path = tmp_path / "central.yaml"
    path.write_text(f"mode: {mode}\ntrain:\n  model: mobilenetv2\n  in_flight: 3\n  pipelined_rate: true\n")
    assert load(CentralConfig, path, {}).train.learning_rate == RATE
    # The flag names the model over a YAML file that names another.
    path.write_text("train:\n  model: mlp\n")
    flags = {"train": {"model": "mobilenetv2", "pipelined_rate": True}}
    assert load(CentralConfig, path, flags).train.learning_rate == RATE
    nested = build(
        DemoConfig, {"central": {"mode": mode, "train": {"model": "mobilenetv2", "pipelined_rate": True}}}
    )
    assert nested.central.train.learning_rate == RATE


def test_a_rate_that_is_set_is_kept_wherever_it_is_set(tmp_path: Path) -> None:
    given = TrainConfig(model="mobilenetv2", learning_rate=0.05)
    assert CentralConfig(train=given).train.learning_rate == 0.05
    data = {"train": {"model": "mobilenetv2", "learning_rate": 0.1}}
    assert build(CentralConfig, data).train.learning_rate == 0.1
    path = tmp_path / "central.yaml"
    path.write_text("train:\n  model: mobilenetv2\n  learning_rate: 0.05\n")
    assert load(CentralConfig, path, {}).train.learning_rate == 0.05
    path.write_text("train:\n  model: mobilenetv2\n")
    assert load(CentralConfig, path, {"train": {"learning_rate": 0.07}}).train.learning_rate == 0.07


@pytest.mark.parametrize(
    ("mode", "in_flight"), [("pipeline", 1), ("hybrid", 1), ("allreduce", 0), ("split-federated", 0)]
)
def test_a_run_without_staleness_keeps_the_default(mode: str, in_flight: int) -> None:
    train = TrainConfig(model="mobilenetv2", in_flight=in_flight, pipelined_rate=True)
    assert CentralConfig(mode=mode, train=train).train.learning_rate == DEFAULT
    assert pipelined_learning_rate("mobilenetv2", mode, in_flight) is None


@pytest.mark.parametrize("model", ["mlp", "cnn", "vgg5", "mobilenetv3", "pkg.module:function"])
def test_models_that_train_at_the_default_keep_it(model: str) -> None:
    train = TrainConfig(model=model, pipelined_rate=True)
    assert CentralConfig(train=train).train.learning_rate == DEFAULT
    assert pipelined_learning_rate(model, "pipeline", 0) is None


def test_a_bad_training_section_is_still_reported_by_validation() -> None:
    with pytest.raises(ConfigError, match="train"):
        build(CentralConfig, {"train": ["mobilenetv2"]})
    with pytest.raises(ConfigError, match="in_flight"):
        build(CentralConfig, {"train": {"model": "mobilenetv2", "in_flight": -1, "pipelined_rate": True}})


def test_a_deeper_pipeline_scales_the_models_rate_by_its_staleness() -> None:
    """Up to 4 stages (3 updates old) the model's rate as measured; beyond, times 3 over the staleness."""
    assert PIPELINED_RATE_STALENESS == 3
    assert [staleness_scaled(RATE, k) for k in (1, 3, 4)] == [RATE] * 3
    assert staleness_scaled(RATE, 5) == pytest.approx(RATE * 3 / 4)
    assert staleness_scaled(RATE, 8) == pytest.approx(RATE * 3 / 7)
    config = CentralConfig(train=TrainConfig(model="mobilenetv2", pipelined_rate=True))
    assert config.model_rate
    assert config.rate_for(3) == RATE and config.rate_for(8) == pytest.approx(RATE * 3 / 7)
    # The demo sets its workers by a copy: the mark survives it; in_flight bounds the staleness.
    assert config.model_copy(update={"workers": 7}).rate_for(8) == pytest.approx(RATE * 3 / 7)
    bounded = CentralConfig(train=TrainConfig(model="mobilenetv2", in_flight=4, pipelined_rate=True))
    assert bounded.rate_for(8) == RATE
    nested = build(DemoConfig, {"central": {"train": {"model": "mobilenetv2", "pipelined_rate": True}}})
    assert nested.central.model_rate and nested.central.rate_for(6) == pytest.approx(RATE * 3 / 5)
    # Once taken for a run, the scaled rate counts as set: taken again, it is not scaled twice.
    deep = config.for_devices(8)
    assert deep.train.learning_rate == pytest.approx(RATE * 3 / 7) and not deep.model_rate
    assert deep.for_devices(8) is deep and config.for_devices(3) is config


def test_a_rate_that_is_set_or_a_hybrid_run_is_not_scaled() -> None:
    given = CentralConfig(train=TrainConfig(model="mobilenetv2", learning_rate=RATE, pipelined_rate=True))
    assert not given.model_rate and given.rate_for(8) == RATE  # 0.02 set by hand: kept at any depth
    set_rate = {"model": "mobilenetv2", "learning_rate": 0.1, "pipelined_rate": True}
    assert not build(CentralConfig, {"train": set_rate}).model_rate
    hybrid = CentralConfig(mode="hybrid", train=TrainConfig(model="mobilenetv2", pipelined_rate=True))
    assert hybrid.model_rate and hybrid.rate_for(8) == RATE  # its stages are fewer than its devices
    mlp = CentralConfig(train=TrainConfig(model="mlp", pipelined_rate=True))
    assert not mlp.model_rate and mlp.rate_for(8) == DEFAULT
