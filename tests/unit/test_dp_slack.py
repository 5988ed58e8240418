"""The partition DP's tie rules (planner.dp, ``Problem.tie_break``): ``"latest"`` (the baseline) and
``"slack"`` (the least sum of stage times among the splits within ``(1 + tie_tolerance) T*``)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from edgeagent.cli.train import _central_overrides, central
from edgeagent.config import CentralConfig, build
from edgeagent.errors import ConfigError
from edgeagent.modes.pipeline.central.context import RunState
from edgeagent.planner.dp import (
    Link,
    Problem,
    brute_force,
    compute_sum,
    fits,
    predict,
    problem_for_uniform,
    solve,
)
from edgeagent.planner.partition import check_points
from tests.unit.test_planner import random_problem as planner_problem

FREE = Link(math.inf)


def random_table(
    rng: random.Random, times: tuple[float, ...], *, ties: bool
) -> tuple[tuple[float, ...], ...]:
    """A predictor-like table ``table[s][e - s - 1]``: the range's sum times a device factor, with noise
    per range (not additive, as the predictor's are not)."""
    factor = rng.choice([1.0, 2.0, 10.0]) if ties else rng.uniform(0.5, 12.0)
    rows = []
    for s in range(len(times)):
        row = []
        for e in range(s + 1, len(times) + 1):
            base = sum(times[s:e]) * factor
            row.append(float(round(base)) if ties else base * rng.uniform(0.8, 1.2))
        rows.append(tuple(row))
    return tuple(rows)


def random_problem(rng: random.Random, *, ties: bool) -> Problem:
    """test_planner's small random instances, half of them with some stages timed by a table (AccEPT
    eq. 10); ``ties`` draws from small integer sets so that optima and sums are often shared."""
    p = planner_problem(rng, ties=ties)
    if rng.random() < 0.5:
        tables = tuple(
            None if rng.random() < 0.4 else random_table(rng, p.layer_times, ties=ties)
            for _ in range(p.num_stages)
        )
        p = replace(p, range_times=tables)
    return p


def test_solve_equals_brute_force_for_both_rules() -> None:
    rng = random.Random(4711)
    infeasible = differs = above_optimum = 0
    for case in range(400):
        p = random_problem(rng, ties=case % 2 == 0)
        try:
            latest = brute_force(p)
        except ValueError:
            infeasible += 1
            for rule in ("latest", "slack"):
                with pytest.raises(ValueError, match="fits the memory limits"):
                    solve(replace(p, tie_break=rule))
            continue
        assert solve(p) == latest, (case, p)
        optimum = predict(p, latest)
        for tolerance in (0.0, 0.1):
            q = replace(p, tie_break="slack", tie_tolerance=tolerance)
            got, expected = solve(q), brute_force(q)
            check_points(got, p.num_layers)
            assert got == expected, (case, tolerance, p)
            assert fits(p, got)
            assert predict(p, got) <= optimum * (1 + tolerance)
            assert compute_sum(p, got) <= compute_sum(p, latest)
            if tolerance == 0.0:
                assert predict(p, got) == optimum
                differs += got != latest
            else:
                above_optimum += predict(p, got) > optimum
        # "latest" ignores the tolerance.
        assert solve(replace(p, tie_tolerance=0.1)) == latest
    assert infeasible >= 10 and differs >= 15 and above_optimum >= 5, (infeasible, differs, above_optimum)


def test_slack_gives_a_ten_times_slower_last_stage_fewer_layers() -> None:
    # Slowdowns 1, 1, 10 (the measured MobileNetV2 pattern). "latest" gives the last stage the fewest
    # layers among the splits with the optimal bottleneck (2 s), so "slack" with no tolerance agrees; the
    # default tolerance of the central node (0.02) lets the last stage drop a layer for 1.6 % more
    # bottleneck on a fast device, and the sum of stage times falls.
    p = Problem(
        layer_times=(1.0, 1.0, 1.0, 1.0, 0.03125, 0.03125),
        output_bytes=(1000,) * 6,
        capacities=(1.0, 1.0, 10.0),
        links=(Link(1e6), Link(1e6)),
    )
    latest = solve(p)
    assert latest == brute_force(p) == [0, 2, 4, 6]
    assert solve(replace(p, tie_break="slack")) == latest
    q = replace(p, tie_break="slack", tie_tolerance=0.02)
    slack = solve(q)
    assert slack == brute_force(q) == [0, 2, 5, 6]
    assert slack[3] - slack[2] == 1 < latest[3] - latest[2] == 2
    assert predict(p, latest) == 2.0 < predict(p, slack) == 2.03125 <= 2.0 * 1.02
    assert compute_sum(p, slack) == 4.34375 < compute_sum(p, latest) == 4.625


def test_slack_gives_a_ten_times_slower_central_node_fewer_layers() -> None:
    # A slow stage 0 (the central node's --slowdown): "latest" fills it up to the bottleneck (layer 4 on
    # stage 2, 4 s); "slack" keeps it to one layer at the same bottleneck, no tolerance needed.
    p = Problem(
        layer_times=(0.125, 0.125, 0.125, 1.0, 4.0),
        output_bytes=(1000,) * 5,
        capacities=(10.0, 1.0, 1.0),
        links=(Link(1e6), Link(1e6)),
    )
    q = replace(p, tie_break="slack")
    assert solve(p) == brute_force(p) == [0, 3, 4, 5]
    assert solve(q) == brute_force(q) == [0, 1, 4, 5]
    assert predict(p, [0, 3, 4, 5]) == predict(p, [0, 1, 4, 5]) == 4.0
    assert compute_sum(p, [0, 1, 4, 5]) == 6.5 < compute_sum(p, [0, 3, 4, 5]) == 8.75


def test_tolerance_trades_bottleneck_for_sum() -> None:
    # [0, 1, 3] is the optimum (3 s); [0, 2, 3] is 3.25 s but moves a layer off the 8x slower device.
    p = Problem(
        layer_times=(3.0, 0.25, 0.125),
        output_bytes=(0, 0, 0),
        capacities=(1.0, 8.0),
        links=(FREE,),
        tie_break="slack",
    )
    assert solve(p) == [0, 1, 3]
    tolerant = replace(p, tie_tolerance=0.1)
    assert solve(tolerant) == brute_force(tolerant) == [0, 2, 3]
    assert predict(p, [0, 2, 3]) == 3.25 <= 3.0 * 1.1
    assert compute_sum(p, [0, 2, 3]) == 4.25 < compute_sum(p, [0, 1, 3]) == 6.0
    assert solve(replace(p, tie_tolerance=0.05)) == [0, 1, 3]  # 3.25 > 3.15


def test_equal_sums_fall_back_to_the_latest_rule() -> None:
    # Equal devices, free links, integer times: every split's sum is the same, so "slack" is "latest".
    p = problem_for_uniform([1.0, 2.0, 1.0, 1.0, 2.0, 1.0], [0] * 6, 3)
    assert p.tie_break == "latest" and p.tie_tolerance == 0.0
    slack = replace(p, tie_break="slack", tie_tolerance=0.5)
    assert solve(slack) == brute_force(slack)
    assert solve(replace(p, tie_break="slack")) == solve(p) == brute_force(p)


def test_bad_tie_options_are_rejected() -> None:
    p = problem_for_uniform([1.0, 1.0], [0, 0], 2)
    with pytest.raises(ValueError, match=r"tie_break 'foo' must be one of 'latest', 'slack'"):
        replace(p, tie_break="foo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"tie_tolerance -1 must be finite and >= 0"):
        replace(p, tie_tolerance=-1)
    with pytest.raises(ValueError, match=r"tie_tolerance nan must be finite and >= 0"):
        replace(p, tie_tolerance=math.nan)
    with pytest.raises(ValueError, match=r"tie_tolerance inf must be finite and >= 0"):
        replace(p, tie_tolerance=math.inf)


# --------------------------------------------------------------------------------------------------
# The central node's options (--tie-break, --tie-tolerance)


def test_config_defaults_and_validation() -> None:
    config = CentralConfig()
    assert config.tie_break is None and config.tie_tolerance == 0.02
    assert build(CentralConfig, {"tie_break": "slack", "tie_tolerance": 0.1}).tie_break == "slack"
    bad_values: list[dict[str, object]] = [
        {"tie_break": "foo"},
        {"tie_tolerance": -1},
        {"tie_tolerance": math.nan},
        {"tie_tolerance": 2},
    ]
    for bad in bad_values:
        with pytest.raises(ConfigError, match="tie_"):
            build(CentralConfig, bad)


def test_cli_flags_reach_the_config() -> None:
    kw = {"tie_break": "latest", "tie_tolerance": 0.05, "epsilon": None}
    assert _central_overrides(kw) == {"tie_break": "latest", "tie_tolerance": 0.05}
    result = CliRunner().invoke(central, ["--tie-break", "foo"])
    assert result.exit_code == 2 and "'foo' is not one of 'latest', 'slack'" in result.output


def test_default_rule_follows_the_estimator() -> None:
    """``--tie-break`` unset: slack when the latency predictor plans, latest for the baselines."""

    def rule(predictor: bool, **config: object) -> str:
        run = SimpleNamespace(config=CentralConfig(**config), device_times=object() if predictor else None)
        return RunState.tie_break.fget(run)  # type: ignore[attr-defined]

    assert rule(True) == "slack"
    assert rule(False) == "latest"  # --estimator capacity, --partition oracle/uniform, no predictor
    assert rule(True, tie_break="latest") == "latest"
    assert rule(False, tie_break="slack") == "slack"
