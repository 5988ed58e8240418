"""A step learning-rate schedule (``--lr-schedule step --lr-milestones 30,60``) and AccEPT's adaptive bit
widths taken from its milestones (Sec. 3.3: +1 forward bit at every rate change, gradients 8 -> 4 at the
first). Pure: no broker."""

from __future__ import annotations

import pytest
import torch
import yaml
from click.testing import CliRunner

from edgeagent.cli.main import main
from edgeagent.compression import BitSchedule, adaptive_for, adaptive_schedule
from edgeagent.compression.schedule import stage_bits
from edgeagent.config import CentralConfig, TrainConfig, build
from edgeagent.errors import ConfigError
from edgeagent.models import ModelSpec
from edgeagent.pipeline.build import make_stage
from edgeagent.pipeline.sgd import rate_factor
from edgeagent.protocol.options import TrainOptions, milestone_steps


def test_a_step_schedule_multiplies_by_gamma_at_every_milestone_reached() -> None:
    steps = milestone_steps((2, 4), 10)
    assert steps == (20, 40)
    factors = [rate_factor("step", s, 60, steps, 0.5) for s in (0, 19, 20, 39, 40, 59)]
    assert factors == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    assert rate_factor("constant", 50, 60, steps, 0.5) == 1.0  # milestones only count under step


def test_a_stage_updates_at_the_dropped_rate_once_a_milestone_is_passed() -> None:
    spec = ModelSpec("mlp", (64,), 10, ())
    options = TrainOptions(learning_rate=0.1, lr_schedule="step", lr_steps=(2,), lr_gamma=0.5)
    stage = make_stage(spec, seed=0, start=0, end=6, index=0, num_stages=1, options=options)
    x, y = torch.randn(4, 8, 64), torch.randint(0, 10, (4, 8))
    rates = []
    for b in range(4):
        stage.forward(b, x[b])
        stage.backward(b, labels=y[b])
        assert stage.optimizer is not None
        rates.append(stage.optimizer.lr)
    # The rate an update used is set before it: updates 0-1 at 0.1, from update 2 (epoch 2's first) 0.05.
    assert rates[-1] == pytest.approx(0.05)
    assert stage._rate_factor(1) == 1.0 and stage._rate_factor(2) == 0.5


def test_the_config_takes_milestones_only_with_the_step_schedule_and_inside_the_run() -> None:
    ok = TrainConfig(epochs=10, lr_schedule="step", lr_milestones=(3, 7), lr_gamma=0.2)
    assert ok.lr_milestones == (3, 7)
    assert TrainOptions.of(ok).lr_gamma == 0.2
    for bad in (
        {"lr_schedule": "step"},  # no milestones
        {"lr_schedule": "cosine", "lr_milestones": [3]},  # milestones without step
        {"lr_schedule": "step", "lr_milestones": [3, 3]},
        {"lr_schedule": "step", "lr_milestones": [0, 3]},
        {"lr_schedule": "step", "lr_milestones": [3, 10]},  # the run's last epoch is 9
    ):
        with pytest.raises(ConfigError, match="lr_milestones"):
            build(CentralConfig, {"train": {"epochs": 10, **bad}})


def test_the_command_line_sets_milestones_and_gamma() -> None:
    args = ["central", "--epochs", "8", "--lr-schedule", "step", "--lr-milestones", "2,5"]
    args += ["--lr-gamma", "0.5"]
    result = CliRunner().invoke(main, [*args, "--print-config"], prog_name="edgeagent")
    assert result.exit_code == 0, result.output
    train = yaml.safe_load(result.stdout)["train"]
    assert (train["lr_schedule"], train["lr_milestones"], train["lr_gamma"]) == ("step", [2, 5], 0.5)
    bad = CliRunner().invoke(main, [*args, "--lr-milestones", "2,x", "--print-config"], prog_name="edgeagent")
    assert bad.exit_code != 0 and "--lr-milestones" in bad.output


def test_adaptive_bits_follow_the_milestones_when_the_run_has_them() -> None:
    assert adaptive_for(200, (130, 175)) == BitSchedule.from_lr_milestones((130, 175))
    assert adaptive_for(200, ()) == adaptive_schedule(200)  # no milestones: fractions of the run
    # The paper's MobileNetV2 run (Sec. 4.3.2): 2 bits to epoch 130, 3 to 175, then 4; gradients 8 -> 4.
    per_epoch = [stage_bits("adaptive", 3, epoch=e, epochs=200, milestones=(130, 175)) for e in (0, 130, 175)]
    assert [f[0] for f, _ in per_epoch] == [2, 3, 4]
    assert [b[0] for _, b in per_epoch] == [8, 4, 4]
    # Without milestones the fraction rule decides (2 -> 3 at a third of the run).
    assert stage_bits("adaptive", 2, epoch=70, epochs=200)[0] == [3, 3]
    assert stage_bits("adaptive", 2, epoch=70, epochs=200, milestones=(130, 175))[0] == [2, 2]
