"""Config (``config.py``): errors name the file and the key; overrides; the repo's configs validate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgeagent.config import CentralConfig, DemoConfig, TrainConfig, build, load, load_yaml
from edgeagent.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_config_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "central.yaml"
    path.write_text("workers: 2\ntrain:\n  epoch: 3\n")  # typo: epochs
    with pytest.raises(ConfigError) as info:
        load(CentralConfig, path, {})
    assert str(path) in str(info.value) and "train.epoch" in str(info.value)
    path.write_text("wokers: 2\n")
    with pytest.raises(ConfigError, match=r"unknown key 'wokers'") as info:
        load(CentralConfig, path, {})
    assert str(path) in str(info.value)


def test_config_wrong_type_names_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"<arguments>: workers:"):
        build(CentralConfig, {"workers": "many"})
    with pytest.raises(ConfigError, match=r"train\.learning_rate"):
        build(CentralConfig, {"train": {"learning_rate": -1}}, source="x.yaml")
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  epochs: lots\n")
    with pytest.raises(ConfigError) as info:
        load(CentralConfig, path, {})
    assert str(path) in str(info.value) and "train.epochs" in str(info.value)


def test_config_yaml_syntax_error_names_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("train:\n  epochs: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load(CentralConfig, path, {})
    assert str(path) in str(info.value)
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping") as info:
        load_yaml(path)
    assert str(path) in str(info.value)
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match="cannot read") as info:
        load(CentralConfig, missing, {})
    assert str(missing) in str(info.value)


def test_config_overrides_merge_over_yaml(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("workers: 3\ntrain:\n  epochs: 2\n  batch_size: 8\n")
    cfg = load(CentralConfig, path, {"train": {"epochs": 7}})
    assert cfg.workers == 3 and cfg.train.epochs == 7 and cfg.train.batch_size == 8
    assert load(CentralConfig, None, {}) == CentralConfig()
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load(CentralConfig, empty, {}).train == TrainConfig()


def _repo_configs() -> list[Any]:
    files = sorted((REPO / "configs").glob("**/*.yaml"))
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason="no configs/**/*.yaml yet"), id="none")]
    return [pytest.param(f, id=str(f.relative_to(REPO))) for f in files]


@pytest.mark.parametrize("path", _repo_configs())
def test_repo_training_configs_validate(path: Path) -> None:
    data = load_yaml(path)
    if "train" not in data:
        pytest.skip(f"{path.name} has no train: key (not a central config)")
    # `edgeagent demo` pops its own `demo:` section before validating the rest as a CentralConfig
    # (cli.demo); check that section strictly too, so a typo in it is caught here.
    demo_part = data.pop("demo", None)
    if demo_part is not None:
        assert isinstance(demo_part, dict), f"{path}: demo: must be a mapping"
        build(DemoConfig, demo_part, source=f"{path} (demo:)")
    cfg = build(CentralConfig, data, source=str(path))
    assert isinstance(cfg.train, TrainConfig)
