"""The training commands' options: grouped with defaults, per-mode options refused under another mode (flag
and YAML), deprecated aliases, EDGEAGENT_<KEY> variables and --print-config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from edgeagent.cli import flags
from edgeagent.cli.main import main
from edgeagent.config import CentralConfig, WorkerConfig, build
from edgeagent.errors import ConfigError
from edgeagent.mode_names import MODES, mode_keys, mode_names


def run(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, list(args), env=env, prog_name="edgeagent")


def effective(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run(*args, "--print-config", env=env)
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.stdout)
    assert isinstance(data, dict)
    return data


def command(name: str) -> click.Command:
    found = main.get_command(click.Context(main), name)
    assert found is not None
    return found


@pytest.mark.parametrize("name", ["central", "demo", "worker"])
def test_help_shows_groups_and_every_default(name: str) -> None:
    text = run(name, "--help").output
    for title in ("Run:", "Cluster and broker:", "Security:", "Advanced / lab", "Split-federated (--mode"):
        assert title in text, title
    if name != "worker":
        assert "Allreduce (--mode allreduce only):" in text and "Hybrid (--mode hybrid only):" in text
        assert "[default: ft-tree]" in text and "[default: 0.05]" in text
    for param in command(name).params:
        if (
            isinstance(param, click.Option)
            and not param.hidden
            and param.envvar
            and param.name != "config_file"
        ):
            assert "[default: " in (param.help or ""), param.name
    # Methods by name: the papers are not shipped.
    assert "the paper" not in text.lower() and "papers/" not in text and "Table I" not in text


def test_central_help_is_shorter_than_its_62_flat_options() -> None:
    lines = CliRunner().invoke(main, ["central", "--help"], terminal_width=100).output.splitlines()
    assert len(lines) < 230  # 230 lines before the groups, at the same width


def test_mode_names_are_declared_once() -> None:
    # The registry is the one declaration: the configuration's schema, --mode's choices and the modes'
    # options all read it.
    schema = CentralConfig.model_json_schema()["properties"]["mode"]
    assert set(MODES) == set(mode_names()) == set(schema["enum"])
    mode = next(p for p in command("central").params if p.name == "mode")
    assert isinstance(mode.type, click.Choice) and tuple(mode.type.choices) == mode_names()
    assert set(mode_keys()) <= set(CentralConfig.model_fields)


def test_a_yaml_key_of_another_mode_is_refused_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "central.yaml"
    config.write_text("mode: pipeline\ncollective: ring\n")
    result = run("central", "--config", str(config), "--print-config")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {config}: collective applies to --mode allreduce only (mode is pipeline)"
    ]
    with pytest.raises(ConfigError, match="split_point applies to --mode split-federated only"):
        build(CentralConfig, {"mode": "hybrid", "split_point": 2})
    with pytest.raises(ConfigError, match="split applies to --mode split-federated and allreduce only"):
        build(CentralConfig, {"split": "noniid"})
    # Its own mode takes it; a default value changes nothing and passes.
    assert build(CentralConfig, {"mode": "allreduce", "collective": "ring"}).collective == "ring"
    assert build(CentralConfig, {"mode": "pipeline", "collective": "ft-tree"}).mode == "pipeline"


def test_a_flag_of_another_mode_is_refused() -> None:
    result = run("central", "--max-replicas", "2", "--print-config")
    assert result.exit_code == 2
    assert "max_replicas applies to --mode hybrid only (mode is pipeline)" in result.stderr
    assert effective("central", "--mode", "hybrid", "--max-replicas", "2")["max_replicas"] == 2


def test_deprecated_aliases_work_and_warn_once() -> None:
    flags._warned.clear()
    result = run("central", "--lr", "0.2", "--id", "hub", "--print-config")
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.stdout)
    assert data["train"]["learning_rate"] == 0.2 and data["device_id"] == "hub"
    assert result.stderr.count("--lr is deprecated; use --learning-rate") == 1
    assert result.stderr.count("--id is deprecated; use --device-id") == 1
    again = run("worker", "--id", "pi-1", "--print-config")  # the same process: said already
    assert "deprecated" not in again.stderr and yaml.safe_load(again.stdout)["device_id"] == "pi-1"
    # Both spellings: the new name wins.
    assert effective("central", "--lr", "0.2", "--learning-rate", "0.3")["train"]["learning_rate"] == 0.3


def test_environment_sits_between_flag_and_yaml(tmp_path: Path) -> None:
    config = tmp_path / "central.yaml"
    config.write_text("train: {epochs: 3, batch_size: 16}\ncluster: from-yaml\n")
    env = {"EDGEAGENT_EPOCHS": "7", "EDGEAGENT_CLUSTER": "from-env", "EDGEAGENT_LEARNING_RATE": "0.1"}
    data = effective("central", "--config", str(config), "--cluster", "from-flag", env=env)
    assert data["train"]["epochs"] == 7  # env over YAML
    assert data["cluster"] == "from-flag"  # flag over env
    assert data["train"]["batch_size"] == 16  # YAML over default
    assert data["train"]["learning_rate"] == 0.1  # env over default
    assert data["train"]["momentum"] == 0.9  # the default
    worker = effective("worker", "--device-id", "pi-1", env={"EDGEAGENT_THREADS": "3"})
    assert worker["threads"] == 3


def test_print_config_is_the_effective_configuration_and_loads_back(tmp_path: Path) -> None:
    data = effective("central", "--mode", "allreduce", "--collective", "ring", "--epochs", "2")
    config = build(CentralConfig, data)
    assert (config.mode, config.collective, config.train.epochs, config.checkpoint) == (
        "allreduce",
        "ring",
        2,
        "auto",  # the central node's own default
    )
    demo = effective("demo", "--workers", "3")
    assert demo["demo"]["workers"] == 3 and demo["checkpoint"] is None
    worker = effective("worker", "--device-id", "pi-2", "--allow-model", "pkg.mod:make")
    assert build(WorkerConfig, worker).allowed_models == ["pkg.mod:make"]
