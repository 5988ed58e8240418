"""PiPar's profiling phase (papers/003 Sec. 3.3.1): per-layer forward and backward times and output sizes.

``edgeagent.planner.profiler`` times forward and backward of a layer together (what FTPipeHD's DP needs);
PiPar's estimate needs them apart (eq. 5-8), and the size of what crosses the link both ways (eq. 9-10),
so the whole model is trained here for a few iterations, layer by layer, on a random batch of size B.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from edgeagent.models import ModelSpec, build_layers, num_layers
from edgeagent.splitfed.cost import LayerTimes

__all__ = ["param_bytes", "profile_layers"]


Timer = Callable[[], float]  # a clock in seconds (runtime.compute.step_clock)


def _one_pass(
    layers: list[nn.Module], x: torch.Tensor, labels: torch.Tensor, clock: Timer
) -> tuple[list[float], ...]:
    """One training step layer by layer: (forward s, backward s, output bytes, input-gradient bytes)."""
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    fwd: list[float] = []
    for j, layer in enumerate(layers):
        inp = x.detach().requires_grad_(j > 0)  # the device's first layer gets raw data: no gradient
        started = clock()
        out = layer(inp)
        fwd.append(clock() - started)
        inputs.append(inp)
        outputs.append(out)
        x = out
    bwd = [0.0] * len(layers)
    grad_sizes = [0.0] * len(layers)
    started = clock()
    loss = nn.functional.cross_entropy(outputs[-1], labels)
    loss.backward()
    bwd[-1] = clock() - started
    for j in range(len(layers) - 2, -1, -1):
        received = inputs[j + 1].grad  # what the server sends back when the split is after layer j
        assert received is not None
        grad_sizes[j] = float(received.numel() * received.element_size())
        started = clock()
        outputs[j].backward(received)
        bwd[j] = clock() - started
    grad_sizes[-1] = float(outputs[-1].numel() * outputs[-1].element_size())
    act_sizes = [float(o.numel() * o.element_size()) for o in outputs]
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    return fwd, bwd, act_sizes, grad_sizes


def _measure(
    layers: list[nn.Module],
    spec: ModelSpec,
    batch_size: int,
    iterations: int,
    gen: torch.Generator,
    clock: Timer,
) -> tuple[list[float], list[float], list[float], list[float]]:
    x = torch.randn((batch_size, *spec.in_shape), generator=gen)  # (B, *in_shape)
    labels = torch.randint(0, spec.num_classes, (batch_size,), generator=gen)  # (B,)
    runs = [_one_pass(layers, x, labels, clock) for _ in range(iterations + 1)][1:]  # the first warms up
    # The fastest of the runs: noise (another process on the core, a page fault) only ever adds time, and
    # the median of three still carried 20-30 % of it when four devices profiled at once on two cores.
    fwd = [min(r[0][j] for r in runs) for j in range(len(layers))]
    bwd = [min(r[1][j] for r in runs) for j in range(len(layers))]
    return fwd, bwd, runs[0][2], runs[0][3]


def profile_layers(
    spec: ModelSpec,
    batch_size: int,
    *,
    iterations: int = 3,
    seed: int = 0,
    fit_fixed: bool = False,
    clock: Timer = time.perf_counter,
) -> tuple[LayerTimes, tuple[float, ...], tuple[float, ...]]:
    """(per-layer times at batch B, act_bytes, grad_bytes) of the whole model, the fastest of ``iterations``.

    ``act_bytes[q]``/``grad_bytes[q]``: bytes of layer q's output and of its gradient at batch B (what
    crosses the link when the split is after layer q). With ``fit_fixed`` the layers are timed again at
    B/8 (at least 2) and each time split into a fixed part and a part linear in the batch
    (:class:`LayerTimes`'s ``fwd_fixed``/``bwd_fixed``), which is what makes small mini-batches cost more
    than B/N of the full one.

    ``clock``: wall time by default; a device whose slowdown is emulated passes ``time.thread_time``, the
    clock its training steps are scaled by (:func:`~edgeagent.runtime.compute.emulate_slowdown`), so
    that devices profiling at once on one machine's cores do not count each other's time as their own.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 2:
        raise ValueError(
            f"batch_size must be an int >= 2 (BatchNorm trains on >= 2 samples), got {batch_size!r}"
        )
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be an int >= 1, got {iterations!r}")
    layers = build_layers(spec, 0, num_layers(spec), seed=seed)
    for layer in layers:
        layer.train()
    gen = torch.Generator().manual_seed(seed)
    fwd, bwd, act, grad = _measure(layers, spec, batch_size, iterations, gen, clock)
    fwd_fixed: tuple[float, ...] = ()
    bwd_fixed: tuple[float, ...] = ()
    small = max(2, batch_size // 8)
    if fit_fixed and small < batch_size:
        fwd_small, bwd_small, _, _ = _measure(layers, spec, small, iterations, gen, clock)

        def intercept(full: list[float], part: list[float]) -> tuple[float, ...]:
            # t(b) = fixed + slope b through (small, part) and (B, full), kept within [0, full].
            return tuple(
                min(max((p * batch_size - f * small) / (batch_size - small), 0.0), f)
                for f, p in zip(full, part, strict=True)
            )

        fwd_fixed, bwd_fixed = intercept(fwd, fwd_small), intercept(bwd, bwd_small)
    times = LayerTimes(tuple(fwd), tuple(bwd), fwd_fixed, bwd_fixed)
    return times, tuple(act), tuple(grad)


def param_bytes(spec: ModelSpec, *, seed: int = 0) -> tuple[float, ...]:
    """Bytes of each layer's parameters and buffers: what FedAvg moves per layer each epoch (eq. 3)."""
    sizes = []
    for layer in build_layers(spec, 0, num_layers(spec), seed=seed):
        tensors = [*layer.parameters(), *layer.buffers()]
        sizes.append(float(sum(t.numel() * t.element_size() for t in tensors)))
    return tuple(sizes)
