"""Staleness compensation (edgeagent.pipeline.staleness) and the sync schedule, on in-process stages."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from edgeagent.data import batch_indices, load_dataset
from edgeagent.models import ModelSpec, build_model
from edgeagent.pipeline.divergence import divergence, ends_run
from edgeagent.pipeline.replay import build_stages, merged_state, replay
from edgeagent.pipeline.staleness import (
    MOMENTUM_CEILING,
    STALENESS_RULES,
    forward_version,
    predicted,
    stage_delay,
    step_rule,
)
from edgeagent.protocol.options import TrainOptions

DATA = load_dataset("digits", seed=0)
MLP = ModelSpec("mlp", DATA.in_shape, DATA.num_classes)
THREE = [0, 2, 4, 6]
COMPENSATIONS = ("predict", "nesterov", "lookahead", "2bw")


def _batches(
    epochs: int, *, seed: int = 0, count: int | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for epoch in range(epochs):
        for idx in batch_indices(DATA.x_train.shape[0], 32, epoch=epoch, seed=seed):
            out.append((DATA.x_train[idx], DATA.y_train[idx]))
    return out[:count]


def _sgd(
    batches: list[tuple[torch.Tensor, torch.Tensor]], *, lr: float, momentum: float, wd: float
) -> dict[str, torch.Tensor]:
    model = build_model(MLP, seed=0)
    sgd = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=wd)
    for x, y in batches:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        sgd.step()
        sgd.zero_grad()
    return model.state_dict()


def test_each_stage_is_stale_by_its_batches_in_flight_after_it() -> None:
    assert [stage_delay(3, i, 3) for i in range(3)] == [2, 1, 0]
    assert [stage_delay(8, i, 8) for i in range(8)] == [7, 6, 5, 4, 3, 2, 1, 0]
    assert [stage_delay(1, i, 3) for i in range(3)] == [0, 0, 0]  # one batch in flight: nothing stale
    assert [stage_delay(5, i, 3) for i in range(3)] == [4, 3, 0]  # the last stage never waits
    assert stage_delay(3, 2, 3, replicated=True) == 1  # a replicated stage waits for its members
    with pytest.raises(ValueError, match="stage 3 of 3"):
        stage_delay(3, 3, 3)


def test_the_version_forwarded_follows_the_rule() -> None:
    common = {"base": 0, "newest": 9, "delay": 2, "window": 3}
    # Vertical sync: the version the batch's message names (stage 0: its newest).
    assert forward_version("none", 10, asked=7, **common) == 7
    assert forward_version("aggregate", 10, asked=None, **common) == 9
    # The stage's own delay, whatever the message says; never before the stage was (re)built.
    for rule in ("predict", "nesterov", "lookahead"):
        assert forward_version(rule, 10, asked=7, **common) == 8
        assert forward_version(rule, 1, asked=0, **common) == 0
        assert forward_version(rule, 10, asked=None, **{**common, "base": 9}) == 9
    # 2BW: window t = b // 3 forwards the weights after window t - 2's update.
    assert [forward_version("2bw", b, asked=0, **common) for b in range(9)] == [0, 0, 0, 0, 0, 0, 3, 3, 3]


def test_the_delay_aware_nesterov_step_keeps_the_users_long_run_step() -> None:
    lr, mu = 0.05, 0.9
    for rule in ("nesterov", "lookahead"):
        first = step_rule(rule, learning_rate=lr, momentum=mu, weight_decay=0.0, delay=7, depth=8)
        assert first.nesterov and first.momentum == pytest.approx(mu + 7 * (MOMENTUM_CEILING - mu) / 8)
        assert first.learning_rate / (1 - first.momentum) == pytest.approx(lr / (1 - mu))
        last = step_rule(rule, learning_rate=lr, momentum=mu, weight_decay=0.0, delay=0, depth=8)
        assert last.nesterov and last.momentum == mu and last.learning_rate == lr and not last.predict
    assert step_rule("lookahead", learning_rate=lr, momentum=mu, weight_decay=0, delay=3, depth=4).predict
    assert not step_rule("nesterov", learning_rate=lr, momentum=mu, weight_decay=0, delay=3, depth=4).predict
    # No pipelining, or no momentum: the user's SGD.
    for rule in STALENESS_RULES:
        assert step_rule(rule, learning_rate=lr, momentum=mu, weight_decay=0, delay=0, depth=1) == step_rule(
            "none", learning_rate=lr, momentum=mu, weight_decay=0, delay=0, depth=1
        )
    with pytest.raises(ValueError, match="unknown staleness rule"):
        step_rule("psychic", learning_rate=lr, momentum=mu, weight_decay=0, delay=1, depth=2)


def test_a_prediction_over_no_delay_is_the_weights_themselves() -> None:
    rule = step_rule("predict", learning_rate=0.05, momentum=0.9, weight_decay=0, delay=2, depth=3)
    weights = {"w": torch.randn(3)}
    assert predicted(weights, {"w": torch.randn(3)}, rule, 0) is weights
    ahead = predicted(weights, {"w": torch.ones(3)}, rule, 2)
    torch.testing.assert_close(ahead["w"], weights["w"] - 0.05 * 2)


@pytest.mark.parametrize("rule", STALENESS_RULES)
def test_with_one_batch_in_flight_every_rule_is_plain_sgd_bit_for_bit(rule: str) -> None:
    """No staleness (a delay of 0 on every stage): the prediction, the Nesterov step and 2BW's window all
    reduce to the user's SGD, exactly."""
    batches = _batches(1, count=12)
    options = TrainOptions(0.05, momentum=0.9, weight_decay=4e-5, staleness=rule)  # type: ignore[arg-type]
    stages = build_stages(MLP, options, THREE, in_flight=1)
    replay(stages, batches, in_flight=1)
    expected = _sgd(batches, lr=0.05, momentum=0.9, wd=4e-5)
    got = merged_state(stages)
    assert all(torch.equal(got[k], v) for k, v in expected.items())


def test_stale_momentum_sgd_diverges_where_every_compensation_converges() -> None:
    """Digits on three stages, 2 and 1 updates stale, at lr 0.08 and momentum 0.9: plain stale SGD ends at
    chance's loss (it blew up and died), every compensation learns."""
    batches = _batches(3)
    chance = math.log(DATA.num_classes)

    def final_loss(rule: str) -> float:
        options = TrainOptions(0.08, momentum=0.9, staleness=rule)  # type: ignore[arg-type]
        losses = replay(build_stages(MLP, options, THREE), batches)
        return sum(losses[-15:]) / 15

    stale = final_loss("none")
    assert not stale < chance - 0.3  # NaN counts as diverged
    for rule in COMPENSATIONS:
        assert final_loss(rule) < 1.5, rule
    in_step = replay(
        build_stages(MLP, TrainOptions(0.08, momentum=0.9), THREE, in_flight=1), batches, in_flight=1
    )
    assert sum(in_step[-15:]) / 15 < 0.5  # the synchronous run at that rate learns


def test_a_predicting_stage_keeps_only_the_versions_its_delay_needs() -> None:
    options = TrainOptions(0.05, momentum=0.9, staleness="lookahead")
    stages = build_stages(MLP, options, [0, 1, 2, 3, 4, 5, 6])
    replay(stages, _batches(1, count=20))
    for i, stage in enumerate(stages):
        assert stage.delay == (5 - i if i < 5 else 0)
        assert len(stage.stashed_versions) <= stage.delay + 2
        assert set(stage._momenta) <= set(stage.stashed_versions)


def test_2bw_applies_the_mean_of_each_window_once() -> None:
    """With 3 batches per window, the weights change only at windows' ends."""
    options = TrainOptions(0.05, momentum=0.9, staleness="2bw")
    stages = build_stages(MLP, options, THREE)
    seen = []
    for k in range(1, 7):
        replay_part = build_stages(MLP, options, THREE)
        replay(replay_part, _batches(1, count=k))
        seen.append(merged_state(replay_part))
    changed = [any(not torch.equal(a[key], b[key]) for key in a) for a, b in itertools.pairwise(seen)]
    # After 1, 2, ... 6 batches: the updates land after batches 3 and 6.
    assert changed == [False, True, False, False, True]
    assert stages[0].depth == 3


@pytest.mark.parametrize("micro", [1, 3, 5])
def test_the_sync_schedule_replayed_is_sgd_on_whole_batches(micro: int) -> None:
    """Uneven micro-batches (32 rows in 3 or 5) through 1F1B with a flush: the weights of single-process
    SGD on the whole batches (to rounding: the micro-batches' gradients are summed)."""
    batches = _batches(1, count=10)
    options = TrainOptions(0.05, momentum=0.9, weight_decay=4e-5, staleness="lookahead", micro_batches=micro)
    stages = build_stages(MLP, options, THREE)
    replay(stages, batches)
    expected = _sgd(batches, lr=0.05, momentum=0.9, wd=4e-5)
    got = merged_state(stages)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6)
    assert all(stage.version == len(batches) for stage in stages)


def test_divergence_is_told_with_the_figures_and_ends_a_run_only_when_it_lasts() -> None:
    chance = math.log(10)
    assert divergence(0, 2.0, num_classes=10, learning_rate=0.05, staleness="lookahead", in_flight=3) is None
    said = divergence(0, 4.2, num_classes=10, learning_rate=0.05, staleness="none", in_flight=3)
    assert (
        said is not None
        and "4.20" in said
        and f"{chance:.2f}" in said
        and "--learning-rate (now 0.05; try 0.025)" in said
    )
    assert "--staleness lookahead" in said
    nan = divergence(3, float("nan"), num_classes=10, learning_rate=0.05, staleness="lookahead", in_flight=1)
    assert nan is not None and "nan" in nan and "--staleness" not in nan
    assert not ends_run([4.0, 3.0], 10) and not ends_run([4.0, 3.0, 1.0], 10)
    assert ends_run([4.0, 3.0, 2.6], 10)  # three epochs in a row above chance's
    assert ends_run([1.0, float("inf")], 10)
    assert not ends_run([2.31] * 5, 10)  # stuck at chance's is not a blow-up


def test_a_blown_up_loss_makes_a_non_finite_stall_a_divergence() -> None:
    from edgeagent.pipeline.divergence import blown_up, diverged_into_nonfinite

    assert blown_up([0.4, 2.5e8], 10) and blown_up([float("nan")], 10)
    assert not blown_up([0.3, 0.2, 2.4], 10) and not blown_up([], 10)
    line = diverged_into_nonfinite(3, 2.5e8, 1e9, "worker-1 keeps sending values that are not finite")
    assert line.startswith("loss diverged at batch 3") and "lower --learning-rate (now 1e+09)" in line
