"""ResPipe's period T in seconds (replication/period.py, CentralConfig.chain_seconds, --chain-seconds): the
option's validation and the seconds -> batches conversion, pure (no clock, no sleeps)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from edgeagent.cli.train import central
from edgeagent.config import CentralConfig, build
from edgeagent.errors import ConfigError, ProtocolError
from edgeagent.modes.pipeline.central.context import RunState
from edgeagent.protocol.commands import COMMAND_TYPES, SetReplication
from edgeagent.protocol.wire import decode, encode
from edgeagent.replication.period import (
    ChainPoints,
    chain_period,
    measured_batch_seconds,
    period_batches,
    planned_batch_seconds,
    retune,
)


def test_seconds_become_the_nearest_whole_number_of_batches_at_least_one() -> None:
    assert period_batches(30.0, 0.5) == 60  # the paper's T = 30 s at 2 batches/s
    assert period_batches(1.0, 0.3) == 3  # 3.33 -> 3
    assert period_batches(1.0, 0.28) == 4  # 3.57 -> 4
    assert period_batches(0.01, 2.0) == 1  # shorter than a batch: every batch


@pytest.mark.parametrize(
    ("seconds", "per_batch"), [(0, 1), (-1, 1), (math.inf, 1), (math.nan, 1), (1, 0), (1, -2), (1, math.inf)]
)
def test_a_period_or_time_per_batch_that_is_not_positive_and_finite_is_refused(
    seconds: float, per_batch: float
) -> None:
    with pytest.raises(ValueError, match="must be a finite number > 0"):
        period_batches(seconds, per_batch)


def test_the_measured_rate_is_over_the_latest_window_of_commits() -> None:
    # 10 batches at 0.1 s, then 5 at 0.5 s: the window of the last 5 sees only the slow ones.
    times = [0.1 * k for k in range(11)] + [1.0 + 0.5 * k for k in range(1, 6)]
    assert measured_batch_seconds(times, window=5) == pytest.approx(0.5)
    assert measured_batch_seconds(times, window=100) == pytest.approx(3.5 / 15)
    assert measured_batch_seconds([], window=5) is None
    assert measured_batch_seconds([2.0], window=5) is None
    assert measured_batch_seconds([2.0, 2.0], window=5) is None  # no time passed
    with pytest.raises(ValueError, match="window 0"):
        measured_batch_seconds([1.0, 2.0], window=0)


def test_the_planned_step_is_the_slowest_stage() -> None:
    assert planned_batch_seconds([0.01, 0.04, 0.02]) == 0.04
    assert planned_batch_seconds([]) is None
    assert planned_batch_seconds([0.0, 0.0]) is None


def test_the_period_in_batches_stands_unless_seconds_are_given() -> None:
    assert chain_period(50, None, 0.1) == 50
    assert chain_period(0, None, 0.1) == 0  # off stays off
    assert chain_period(50, 3.0, 0.1) == 30
    assert chain_period(50, 3.0, None, current=12) == 12  # no rate yet: the plan's period stays
    assert chain_period(50, 3.0, None) == 50


def test_config_takes_seconds_or_batches_not_both() -> None:
    assert build(CentralConfig, {"chain_seconds": 30}).chain_seconds == 30.0
    assert build(CentralConfig, {}).chain_seconds is None
    with pytest.raises(ConfigError, match=r"chain_every \(20 batches\) and chain_seconds \(30\.0 s\)"):
        build(CentralConfig, {"chain_every": 20, "chain_seconds": 30})
    for bad in (0, -1, "inf", "nan", "soon"):
        with pytest.raises(ConfigError, match=r"<arguments>: chain_seconds:"):
            build(CentralConfig, {"chain_seconds": bad})


def test_the_flag_sets_the_period_and_is_validated() -> None:
    result = CliRunner().invoke(central, ["--chain-seconds", "2.5", "--checkpoint", "off", "--print-config"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output)["chain_seconds"] == 2.5
    result = CliRunner().invoke(central, ["--chain-seconds", "0", "--print-config"])
    assert result.exit_code == 2 and "--chain-seconds" in result.output
    result = CliRunner().invoke(central, ["--chain-seconds", "2", "--chain-every", "5", "--print-config"])
    assert result.exit_code != 0 and "both set" in str(result.output) + str(result.exception)


def _state(config: CentralConfig, commit_times: list[float], *, chain_every: int = 7) -> Any:
    """What RunState.period_for_plan reads: a profile of 4 layers at 10 ms, split 2 | 1 | 1."""
    return SimpleNamespace(
        config=config,
        report=SimpleNamespace(timeline=[{"batch": k, "t": t} for k, t in enumerate(commit_times)]),
        profile=SimpleNamespace(seconds=[0.01, 0.01, 0.01, 0.01]),
        points=[0, 2, 3, 4],
        chain_every=chain_every,
    )


def test_the_central_node_converts_from_the_plan_then_from_the_measured_rate() -> None:
    seconds = CentralConfig(chain_seconds=1.0)
    # Nothing committed: the planned step is stage 0's 20 ms, times the central node's slowdown.
    assert RunState.period_for_plan(_state(seconds, [])) == 50
    assert RunState.period_for_plan(_state(CentralConfig(chain_seconds=1.0, slowdown=2.0), [])) == 25
    # Measured: a batch every 0.25 s -> 4 batches per second.
    assert RunState.period_for_plan(_state(seconds, [0.25 * k for k in range(20)])) == 4
    # In batches: the measured rate changes nothing.
    assert RunState.period_for_plan(_state(CentralConfig(chain_every=9), [0.25 * k for k in range(20)])) == 9


def test_chain_points_change_from_their_start_and_keep_the_old_ones_before() -> None:
    old = ChainPoints(10)
    assert [d for d in range(1, 41) if old.due(d)] == [10, 20, 30, 40]
    new = old.then(4, 30)
    assert [d for d in range(1, 45) if new.due(d)] == [10, 20, 30, 34, 38, 42]
    assert not ChainPoints(0).due(0) and not ChainPoints(0).due(50)  # off


def test_retune_moves_to_the_measured_period_past_the_margin() -> None:
    points = ChainPoints(50)  # planned: 1 s at 20 ms; measured: 100 ms a batch -> 10
    new = retune(points, 1.0, 0.1, done=60, margin=16)
    assert new is not None and new.every == 10
    assert [d for d in range(1, 111) if new.due(d)] == [50, 76, 86, 96, 106]
    # Within the tolerance (20 %) nothing changes; no rate, nothing either.
    assert retune(points, 1.0, 1.0 / 55, done=60, margin=16) is None
    assert retune(points, 1.0, None, done=60, margin=16) is None
    faster = retune(points, 1.0, 0.01, done=60, margin=16)  # 100 batches a second: a longer period
    assert faster is not None and (faster.every, faster.start) == (100, 76)


def test_the_replication_command_round_trips_and_refuses_what_cannot_be_a_period() -> None:
    msg = SetReplication(run_id="r", plan_id=2, from_batch=100, chain_every=10)
    assert COMMAND_TYPES["replication"] is SetReplication
    _, out = decode(encode(msg, sender="central"))
    assert out == msg
    for from_batch, every in ((-1, 10), (100, 0)):
        with pytest.raises(ProtocolError, match="replication needs"):
            SetReplication(run_id="r", plan_id=2, from_batch=from_batch, chain_every=every)
