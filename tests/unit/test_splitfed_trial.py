"""Ours's trial of N in the first epoch (edgeagent.splitfed.trial): the schedule, the pick, and the
messages that carry them."""

from __future__ import annotations

import pytest
import torch

from edgeagent.errors import ProtocolError
from edgeagent.modes.splitfed.messages import SplitRound, SplitUpdate
from edgeagent.protocol.wire import decode, encode
from edgeagent.splitfed.trial import candidates, pick, schedule


def test_candidates_are_the_estimates_n_then_smaller_ones_distinct() -> None:
    assert candidates(22) == [22, 15, 11, 7]
    assert candidates(6) == [6, 4, 3, 2]
    assert candidates(2) == [2, 1]
    assert candidates(1) == [1]
    with pytest.raises(ValueError, match="got 0"):
        candidates(0)


def test_the_schedule_warms_up_at_n_then_tries_each_candidate_in_turn() -> None:
    assert schedule(22, 6) == [22, 22, 15, 11, 7, 22]
    assert schedule(22, 9) == [22, 22, 15, 11, 7, 22, 15, 11, 7]
    assert schedule(22, 4) == []  # too few iterations to try every candidate once
    assert schedule(1, 10) == []  # nothing to try
    assert schedule(2, 3) == [2, 2, 1]


def test_pick_keeps_the_fastest_mean_beyond_the_margin_and_ignores_the_first_iteration() -> None:
    plan = [22, 22, 15, 11, 7, 22]
    # The first iteration (5.0 s, a round's slowest) is not compared; 11 is 20 % faster than 22.
    assert pick([(plan, [5.0, 1.0, 0.9, 0.8, 0.85, 1.0])], 22) == 11
    # 11 only 1 % faster than 22's mean: within the margin, the estimate's N stays.
    assert pick([(plan, [0.1, 1.0, 1.2, 0.99, 1.1, 1.0])], 22) == 22
    # Two devices planned as one pool their iterations: one alone would pick 7, together 15.
    other = [0.1, 1.0, 0.7, 1.0, 1.2, 1.0]
    assert pick([(plan, [0.1, 1.0, 0.95, 1.0, 0.6, 1.0])], 22) == 7
    assert pick([(plan, [0.1, 1.0, 0.95, 1.0, 0.6, 1.0]), (plan, other)], 22) == 15
    # A device that reported fewer iterations (it was left out mid-epoch) counts what it has.
    assert pick([(plan, [0.1, 1.0, 0.5])], 22) == 15
    assert pick([(plan, [])], 22) == 22


def test_the_round_carries_the_schedule_and_the_update_the_iterations_seconds() -> None:
    x = torch.randn(2, 3)
    msg = SplitRound(
        run_id="r", epoch=0, split=1, parallel=22, batch_size=100, tensors={"0.w": x}, schedule=[22, 15, 11]
    )
    assert [msg.parallel_at(i) for i in range(5)] == [22, 15, 11, 22, 22]
    update = SplitUpdate(
        run_id="r", epoch=0, device_id="w1", samples=10, iterations=3, tensors={}, iteration_seconds=[1.0]
    )
    for m in (msg, update):
        _, back = decode(encode(m, sender="w1"))
        assert encode(back, sender="w1") == encode(m, sender="w1")
    _, back_round = decode(encode(msg, sender="w1"))
    assert isinstance(back_round, SplitRound) and back_round.schedule == [22, 15, 11]
    with pytest.raises(ProtocolError, match="schedule"):
        SplitRound(run_id="r", epoch=0, split=1, parallel=2, batch_size=8, tensors={}, schedule=[2, 9])
    with pytest.raises(ProtocolError, match="schedule"):
        SplitRound(run_id="r", epoch=0, split=1, parallel=2, batch_size=8, tensors={}, schedule=[0])
