"""Measuring on this device: per-layer FLOPs, a sub-model's forward+backward seconds, and ``h``.

``h`` (papers/004 Sec. 3.2) is the measured forward+backward time of the ten representative sub-models
(:func:`edgeagent.predictor.submodels.representative`) at the run's batch size. A worker measures it
when it learns the model (``Discover`` names it) and whenever the central node asks again; the time it
may take is bounded by ``budget`` seconds (a representative sub-model not reached is reported as
missing, and the central node then plans that device with FTPipeHD's capacity estimate).

An emulated slower device (``--slowdown``) runs every compute step ``factor`` times its CPU time
(:func:`edgeagent.runtime.compute.emulated_duration`); its ``h`` is measured the same way, so the
predictor sees the device the pipeline will see.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from edgeagent.models import ModelSpec, build_layers, layer_output_shapes, num_layers
from edgeagent.predictor.correction import TILES, tiling
from edgeagent.predictor.submodels import Range, representative
from edgeagent.runtime.compute import Clock, emulated_duration


def model_key(spec: ModelSpec) -> str:
    """What a predictor belongs to (papers/004: one predictor per model): the model's name, input shape,
    classes and options, as a short stable digest. An ``h`` belongs to a model and a batch size."""
    text = json.dumps(spec.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ModelLayers:
    """A built model, a sample input of every layer and its per-layer FLOPs (forward + backward)."""

    spec: ModelSpec
    batch_size: int
    layers: tuple[nn.Module, ...]
    inputs: tuple[torch.Tensor, ...]  # inputs[j]: a batch as layer j receives it
    flops: tuple[float, ...]

    @classmethod
    def build(cls, spec: ModelSpec, batch_size: int, *, seed: int = 0) -> ModelLayers:
        count = num_layers(spec)
        layers = build_layers(spec, 0, count, seed=seed)
        for layer in layers:
            layer.train()
        shapes = layer_output_shapes(spec, batch_size=batch_size)
        generator = torch.Generator().manual_seed(seed)
        first = torch.randn((batch_size, *spec.in_shape), generator=generator)
        inputs = [first, *(torch.randn(shape, generator=generator) for shape in shapes[:-1])]
        flops = tuple(float(_flops(layer, inputs[j], j)) for j, layer in enumerate(layers))
        return cls(spec, batch_size, tuple(layers), tuple(inputs), flops)

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def model_tiling(spec: ModelSpec, flops: Sequence[float], count: int = TILES) -> list[Range]:
    """The tiling a device measures with its ``h`` (:func:`~edgeagent.predictor.correction.tiling`):
    layers grouped by the shape they take as input, merged by their FLOPs (``flops``: per layer, at any
    batch size) down to ``count`` tiles. The worker and the central node compute the same one."""
    shapes = [tuple(spec.in_shape), *(tuple(s[1:]) for s in layer_output_shapes(spec, batch_size=1)[:-1])]
    return tiling(shapes, flops, count)


def _input(x: torch.Tensor, index: int) -> torch.Tensor:
    """A sub-model's input: it needs its gradient unless it is the model's own input (as in training)."""
    return x.detach().requires_grad_(x.is_floating_point() and index > 0)


def _flops(layer: nn.Module, x: torch.Tensor, index: int) -> int:
    with FlopCounterMode(display=False) as counter:
        out = layer(_input(x, index))
        out.backward(torch.ones_like(out))
    layer.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def _step(model: ModelLayers, start: int, end: int) -> None:
    x = _input(model.inputs[start], start)
    for layer in model.layers[start:end]:
        x = layer(x)
    x.backward(torch.ones_like(x))


def best_window(windows: Sequence[float]) -> float:
    """A range's time from its windows: the fastest. Other work on a shared machine only ever adds time
    (Python's ``timeit`` takes the minimum for the same reason), and every window is already a mean over
    many CFS periods, so a quota's throttling is inside it, not dodged by it. Measured on this machine
    (the held-out set's four windows per sub-model): two windows' minimum agreed with the other two's
    within ±10 % for 93 % / 78 % of sub-models (one / two threads under a quota), their median for 52 % /
    53 %."""
    if not windows:
        raise ValueError("no windows to take a time from")
    return min(windows)


MIN_WINDOW = 0.2  # seconds a measurement runs for at least: 10-20 CFS periods (edgeagent.ops.cgroups)


def time_range(
    model: ModelLayers,
    start: int,
    end: int,
    *,
    reps: int = 3,
    slowdown: float = 1.0,
    min_seconds: float = MIN_WINDOW,
) -> float:
    """Mean seconds of forward+backward of layers ``[start, end)``: after a warm-up, back-to-back runs
    until at least ``reps`` runs and ``min_seconds`` have passed.

    A mean over a window, not the median of single runs: under a CPU quota a short step runs at full
    speed until the period's quota is spent and then waits for the next period, so single runs are
    either fast or very slow; a device that trains runs steps back to back and gets the window's mean.
    (The paper averages 100 runs.)
    """
    if not 0 <= start < end <= model.num_layers:
        raise ValueError(f"layer range [{start}, {end}) is empty or outside 0..{model.num_layers}")
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    _step(model, start, end)  # warm-up
    total, count = 0.0, 0
    began = time.perf_counter()
    while count < reps or time.perf_counter() - began < min_seconds:
        started = Clock(slowdown)
        _step(model, start, end)
        total += emulated_duration(started, slowdown)
        count += 1
    for layer in model.layers[start:end]:
        layer.zero_grad(set_to_none=True)
    return total / count


@dataclass(frozen=True)
class Characterisation:
    """A device's ``h`` for one model and batch size, and how long measuring it took."""

    key: str  # model_key(spec)
    batch_size: int
    h: tuple[float, ...]  # seconds per representative sub-model; fewer than 10 if the budget ran out
    seconds: float
    # seconds per range of the model's tiling (model_tiling), measured with h for the
    # per-layer correction; empty when not measured or the budget ran out first
    tiles: tuple[float, ...] = ()

    @property
    def complete(self) -> bool:
        return len(self.h) == len(representative([1.0]))


def characterise_ranges(model: ModelLayers, *, tiles: bool = True) -> tuple[list[Range], list[Range]]:
    """What :func:`characterise` measures: the representative sub-models, and the model's tiling."""
    return representative(model.flops), model_tiling(model.spec, model.flops) if tiles else []


def characterise_bound(
    step: float, ranges: int, *, reps: int = 3, rounds: int = 1, min_seconds: float = MIN_WINDOW
) -> float:
    """An upper bound of the seconds :func:`characterise` takes on a device where forward+backward of
    the whole model takes ``step`` seconds: ``rounds`` windows of ``ranges`` sub-models, none slower than
    the whole model, each a warm-up, then at least ``reps`` runs and ``min_seconds``, and the run that
    crosses the window's end. Found from one step, where characterising itself would take seconds (and,
    on the central node of a demo, the cores the workers measure on)."""
    if not (step >= 0 and ranges >= 0 and reps >= 1 and rounds >= 1 and min_seconds >= 0):
        raise ValueError(f"bad bound inputs: step {step}, ranges {ranges}, reps {reps}, rounds {rounds}")
    return rounds * ranges * (step + max(reps * step, min_seconds) + step)


def characterise(
    model: ModelLayers,
    *,
    budget: float = 60.0,
    reps: int = 3,
    slowdown: float = 1.0,
    rounds: int = 1,
    min_seconds: float = MIN_WINDOW,
    tiles: bool = True,
) -> Characterisation:
    """Measure ``h`` on this device, stopping after ``budget`` seconds (what was not reached is missing),
    and with ``tiles`` the ranges of the model's tiling after it (one more pass of the whole model; kept
    only if every tile was reached). With ``rounds`` > 1 each time is the fastest of that many interleaved
    windows (see :func:`measure_rounds`, :func:`best_window`)."""
    started = time.perf_counter()
    chosen, tiled = characterise_ranges(model, tiles=tiles)
    windows = measure_rounds(
        model,
        [*chosen, *tiled],
        rounds=rounds,
        reps=reps,
        slowdown=slowdown,
        min_seconds=min_seconds,
        budget=budget,
    )
    h = [best_window(w) for w in windows[: len(chosen)] if w]
    measured = tuple(best_window(w) for w in windows[len(chosen) :] if w)
    key = model_key(model.spec)
    took = time.perf_counter() - started
    complete = len(measured) == len(tiled)
    return Characterisation(key, model.batch_size, tuple(h), took, measured if complete else ())


def measure_rounds(
    model: ModelLayers,
    ranges: Sequence[Range],
    *,
    rounds: int,
    reps: int = 1,
    slowdown: float = 1.0,
    min_seconds: float = MIN_WINDOW,
    budget: float = math.inf,
) -> list[list[float]]:
    """``rounds`` windows of every range in ``ranges``, interleaved (round r times every range once
    before round r + 1 starts): per range, its windows' seconds in round order. No window starts after
    ``budget`` seconds (the ranges not reached then have fewer windows, or none).

    Interleaving spreads each range's windows over the whole collection, so a slow minute of the
    machine (or a CPU quota's period landing badly on a window) moves one window of many ranges, which
    :func:`best_window` drops, instead of every window of a few ranges.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    started = time.perf_counter()
    windows: list[list[float]] = [[] for _ in ranges]
    for _ in range(rounds):
        for i, (s, e) in enumerate(ranges):
            if time.perf_counter() - started > budget:
                return windows
            windows[i].append(time_range(model, s, e, reps=reps, slowdown=slowdown, min_seconds=min_seconds))
    return windows


__all__ = [
    "Characterisation",
    "ModelLayers",
    "best_window",
    "characterise",
    "characterise_bound",
    "characterise_ranges",
    "measure_rounds",
    "model_key",
    "time_range",
]
