"""The server-side models of split-federated training in parallel (PiPar Fig. 3(c)) against one after
another (Fig. 3(b)): each device's mini-batches in arrival order, never two at once, and the same bits
either way. No broker."""

from __future__ import annotations

import functools
import threading

import pytest
import torch
from torch import nn

from edgeagent.models import ModelSpec, build_layers, num_layers
from edgeagent.pipeline.sgd import SGD
from edgeagent.protocol.options import TrainOptions
from edgeagent.splitfed.server import ServerSteps, auto_threads, server_step

SPEC = ModelSpec("cnn", (1, 8, 8), 10, ())
DEVICES = ("worker-1", "worker-2", "worker-3")
PARALLEL = 3  # mini-batches per iteration


def _train(threads: int) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, list[torch.Tensor]]]:
    """Three devices' server-side models (layers [1, L)) fed 4 iterations of N = 3 mini-batches, the
    devices' mini-batches interleaved as they might arrive; the final weights and every gradient sent."""
    layers = num_layers(SPEC)
    models = {d: nn.Sequential(*build_layers(SPEC, 1, layers, seed=0)) for d in DEVICES}
    options = TrainOptions(learning_rate=0.05, momentum=0.9, weight_decay=1e-4)
    optimizers = {d: SGD(m.parameters(), options) for d, m in models.items()}
    head = nn.Sequential(*build_layers(SPEC, 0, 1, seed=0))
    gen = torch.Generator().manual_seed(7)
    arrivals = []
    for iteration in range(4):
        for micro in range(PARALLEL):
            for k, d in enumerate(DEVICES):
                x = torch.randn(4, *SPEC.in_shape, generator=gen)  # (B', 1, 8, 8)
                with torch.no_grad():
                    a = head(x) * (1 + k)
                arrivals.append((d, iteration, micro, a, torch.randint(0, 10, (4,), generator=gen)))
    grads: dict[str, list[torch.Tensor]] = {d: [] for d in DEVICES}
    done = {d: 0 for d in DEVICES}
    steps = ServerSteps(threads)

    def work(d: str, a: torch.Tensor, y: torch.Tensor) -> None:
        result = server_step(models[d], optimizers[d], a, y, PARALLEL, done[d] % PARALLEL)
        done[d] += 1
        grads[d].append(result.grad)

    for d, _, _, a, y in arrivals:
        steps.submit(d, functools.partial(work, d, a, y))
    steps.close()
    assert steps.failures == 0
    return {d: {k: v.clone() for k, v in m.state_dict().items()} for d, m in models.items()}, grads


def test_parallel_server_side_models_give_the_sequential_bits_per_device() -> None:
    seq_weights, seq_grads = _train(1)
    par_weights, par_grads = _train(3)
    for d in DEVICES:
        assert len(par_grads[d]) == 4 * PARALLEL
        for a, b in zip(seq_grads[d], par_grads[d], strict=True):
            assert torch.equal(a, b)
        for k, v in seq_weights[d].items():
            assert torch.equal(v, par_weights[d][k]), (d, k)
    # The devices' models did differ (their activations were scaled apart): a real comparison.
    first = seq_weights[DEVICES[0]]
    assert any(not torch.equal(v, seq_weights[DEVICES[1]][k]) for k, v in first.items())


def test_each_device_runs_in_arrival_order_while_devices_overlap() -> None:
    steps = ServerSteps(2)
    order: dict[str, list[int]] = {"a": [], "b": []}
    b_started = threading.Event()
    overlapped = []

    def a_work(i: int) -> None:
        if i == 0:  # waits for b's first work: only possible if b runs at the same time
            overlapped.append(b_started.wait(timeout=30))
        order["a"].append(i)

    def b_work(i: int) -> None:
        b_started.set()
        order["b"].append(i)

    for i in range(5):
        steps.submit("a", functools.partial(a_work, i))
        steps.submit("b", functools.partial(b_work, i))
    assert steps.wait(timeout=30)
    steps.close()
    assert overlapped == [True]
    assert order == {"a": [0, 1, 2, 3, 4], "b": [0, 1, 2, 3, 4]}


def test_sequential_runs_at_once_on_the_callers_thread_and_a_pool_failure_stops_nothing() -> None:
    steps = ServerSteps(1)
    assert not steps.parallel
    seen: list[str] = []

    def bad() -> None:
        raise RuntimeError("a bad mini-batch")

    steps.submit("a", lambda: seen.append(threading.current_thread().name))
    with pytest.raises(RuntimeError):  # sequential: the caller's, as before the pool
        steps.submit("a", bad)
    assert seen == [threading.current_thread().name]
    pool = ServerSteps(2)
    pool.submit("a", bad)
    pool.submit("a", lambda: seen.append("pool after"))
    pool.close()
    assert seen == [threading.current_thread().name, "pool after"] and pool.failures == 1
    with pytest.raises(ValueError):
        ServerSteps(0)


def test_auto_threads_are_the_cores_over_torchs_threads_at_most_one_per_device() -> None:
    assert auto_threads(4, cpus=8, torch_threads=2) == 4
    assert auto_threads(2, cpus=8, torch_threads=2) == 2
    assert auto_threads(4, cpus=2, torch_threads=2) == 1  # this machine: one after another
    assert auto_threads(4, cpus=2, torch_threads=1) == 2
    assert auto_threads(0, cpus=8, torch_threads=1) == 1
