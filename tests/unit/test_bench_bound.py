"""bench/pipeline.py's bound: the ceiling a set-up puts on any pipeline's ratio to the peer."""

from __future__ import annotations

import math

import torch

from bench._peer import (
    PeerConfig,
    PeerJob,
    PeerRun,
    StageResult,
    _stage_module,
    _stage_work,
    ideal_step,
    peer_steps,
)
from edgeagent.data import load_dataset


def test_the_ideal_step_is_the_busiest_stage_or_the_cpu_over_the_cores() -> None:
    equal = [StageResult(r, busy=1.0, cpu=1.0) for r in range(3)]
    assert ideal_step(equal, cores=2) == 1.5  # three stages' CPU on two cores
    assert ideal_step(equal, cores=4) == 1.0
    slow = [
        StageResult(0, busy=1.0, cpu=1.0),
        StageResult(1, busy=1.0, cpu=1.0),
        StageResult(2, busy=4.0, cpu=1.0),
    ]
    assert ideal_step(slow, cores=2) == 4.0  # the slow stage's sleep is not CPU
    run = PeerRun(100.0, 1.0, 100, 0.1, [0, 2, 4, 6], step_seconds=5.0, ideal_step_seconds=4.0)
    assert run.bound == 1.25
    assert math.isnan(PeerRun(100.0, 1.0, 100, 0.1, [0, 6]).bound)  # not calibrated


def test_a_slowed_stage_is_timed_with_its_emulated_slowdown_and_its_real_cpu() -> None:
    config = PeerConfig(
        num_stages=3, baseline="sockets", schedule="1f1b", microbatches=3, batches=6, ports=[0], timeout=60.0
    )
    data = load_dataset("digits", seed=0)
    steps = peer_steps(data, config.microbatches, config.batches)
    job = PeerJob([0, 2, 4, 6], [1.0, 1.0, 4.0])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a stage process: the slowdown scales the calling thread's CPU
    try:
        fast = _stage_work(
            config, job, 1, _stage_module(config, job, 1, data.in_shape, data.num_classes), steps, data
        )
        slow = _stage_work(
            config, job, 2, _stage_module(config, job, 2, data.in_shape, data.num_classes), steps, data
        )
    finally:
        torch.set_num_threads(threads)
    assert fast.cpu > 0 and slow.cpu > 0
    # The slow stage sleeps three times the CPU time of its forwards, backwards and update: its wall time
    # is about 4x its CPU whatever the load (the loss, outside the slowed module, is not stretched).
    assert slow.busy >= 2 * slow.cpu
    assert fast.busy > 0
